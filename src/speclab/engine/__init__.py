"""The real-engine side: a vLLM worker process that runs benchmark cells (see protocol.py)."""
