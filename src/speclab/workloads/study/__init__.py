"""The study's datasets, loaded through Hugging Face `datasets` or from a local file in the same schema.

Each module registers one StudyDataset (see speclab.workloads.study_base). `datasets` is imported only when
a hub load is attempted.
"""
