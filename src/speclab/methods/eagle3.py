"""EAGLE-3 proposer: a trained EAGLE-3 head (speclab.models.eagle3, the checkpoint vLLM's `eagle3` method
loads) fed with the target's hidden states, for replay tracing, `trace crosscheck` and live drafting.

The head's forward is not written here: replay and live drafting call `Eagle3Head.iter_ttt` and
`Eagle3Head.greedy_chain`, the code the trainer uses, so training, replay and crosscheck cannot drift apart.

What vLLM 0.32 computes (v1/spec_decode/llm_base_proposer.py, models/llama_eagle3.py), restated:
- target features at position t: the target's residual stream entering each layer in
  `eagle_aux_hidden_state_layer_ids` (vLLM's aux hidden states: hidden + residual before layer i, i.e.
  Hugging Face `hidden_states[i]`), concatenated in layer order, then the head's `fc`;
- the head's input at position t is (token x[t+1], feature at t), at rope position t: the proposer shifts
  the target's tokens left by one and puts the token just sampled in the last slot. With context x[..T-1]
  the first draft is the head's output at position T-2 (token x[T-1], the target's features at T-2);
- draft j+1 feeds draft j (a target id, embedded with the target's embedding) and the head's pre-norm output
  at position T-2+j, attending to the head's cache over the context plus the earlier drafts. The cache at
  context positions always holds the step-0 (target-feature) entries: each proposer call first re-runs the
  head over the tokens the target just verified, overwriting what earlier drafts wrote there, and rejected
  slots lie past the sequence length the drafts attend to;
- logits over the reduced draft vocabulary map back to target ids by `d2t` (target = draft + d2t[draft]);
  greedy drafting takes the argmax.

Replay: a greedy chain matters only up to its first wrong draft, and while it is right its inputs are the
target's own tokens. So one training-time-test pass (`iter_ttt`) over prompt + output, fed the true tokens,
gives at every position the k drafts of the chain started there as long as it is right: acc_len(p) = 1 +
the number of leading drafts equal to the output. Positions are processed in blocks of rows, and a block
stops at the first chain step where none of its chains is still right. `propose` drafts step by step with
the head's own tokens (the naive reference the unit test compares the replay with).

Numerics: the target features come from one teacher-forced Hugging Face forward; vLLM computes them in its
own prefill and verify batches. In fp32 the two differ only in summation order, so a draft can differ only
at a near-exact logit tie. bf16 runs are replayed with the target in bf16 and the head in fp32: approximate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from speclab.errors import ConfigError

MISSING_HEAD = (
    "eagle3 replay needs a trained EAGLE-3 head: --eagle3-head DIR or a preset name "
    "(e.g. smollm2-135m-eagle3; train one with `speclab drafters train eagle`)"
)


class Eagle3Proposer:
    """`head`: an Eagle3Head or a head directory; `target`: a Hugging Face causal LM or its checkpoint path
    (the model whose hidden states feed the head)."""

    name = "eagle3"

    def __init__(
        self,
        head: Any = None,
        target: Any = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        threads: int | None = None,
        block: int = 256,
        chunk: int = 1024,
    ) -> None:
        import torch

        from speclab.models.eagle3 import Eagle3Head

        if head is None or head == "":
            raise ConfigError(MISSING_HEAD)
        if target is None or target == "":
            raise ConfigError(
                "eagle3 replay needs its target (--target): the model whose hidden states feed the head"
            )
        if isinstance(head, str | Path) and not (Path(head) / "config.json").is_file():
            raise ConfigError(f"eagle3 head {head}: not found (no config.json); {MISSING_HEAD}")
        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        if isinstance(target, str | Path):
            from transformers import AutoModelForCausalLM

            if not Path(target).exists():
                raise ConfigError(
                    f"eagle3 target {target}: not found (prepare it with `speclab models prepare`)"
                )
            target = AutoModelForCausalLM.from_pretrained(str(target), dtype=getattr(torch, dtype))
        self.target = target.eval()
        if not isinstance(head, Eagle3Head):
            embed = self.target.get_input_embeddings().weight.detach().float()
            head = Eagle3Head.load(Path(head), embed)
        self.head = head.eval()
        # vLLM collects aux states while walking the layers, so their order is the layers' order
        self.aux = sorted({int(a) for a in self.head.cfg["eagle_aux_hidden_state_layer_ids"]})
        n_layers = int(self.target.config.num_hidden_layers)
        if any(not 0 <= a < n_layers for a in self.aux):
            # HF's hidden_states[n_layers] is after the final norm; vLLM's aux states are all pre-norm
            raise ConfigError(f"eagle3 head: aux layers {self.aux} outside 0..{n_layers - 1} of the target")
        if int(self.head.cfg["vocab_size"]) != int(self.target.config.vocab_size):
            raise ConfigError(
                f"eagle3 head: vocabulary {self.head.cfg['vocab_size']} != the target's "
                f"{self.target.config.vocab_size} (a head for another target?)"
            )
        self.draft_ids = self.head.draft_ids().numpy()
        self.max_model_len = max_model_len
        self.block = block
        self.chunk = chunk
        self._last: tuple[bytes, Any] | None = None

    def features(self, x: np.ndarray) -> Any:
        """The target's aux features at every position of x: [len(x), A*H] float32 (teacher forcing,
        chunked over a reused KV cache). The last call's result is kept: replay and the expected
        acceptance of one record share one forward of the target."""
        torch = self.torch
        from speclab.methods.draft_model import chunked_forward

        x = np.asarray(x, dtype=np.int64)
        if self._last is not None and self._last[0] == x.tobytes():
            return self._last[1]

        def aux(out: Any) -> Any:
            return torch.cat([out.hidden_states[a][0] for a in self.aux], -1).float()

        feats = torch.cat(
            chunked_forward(self.target.base_model, x, self.chunk, aux, output_hidden_states=True)
        )
        self._last = (x.tobytes(), feats)
        return feats

    # --- live -------------------------------------------------------------------------------------
    def propose(self, context_ids: np.ndarray, k: int) -> np.ndarray:
        """The k tokens the head drafts after this context, step by step (no replay shortcut)."""
        torch = self.torch
        x = np.asarray(context_ids, dtype=np.int64)
        if self.max_model_len is not None:
            k = min(k, self.max_model_len - len(x))
        if k <= 0 or len(x) < 2:
            return np.empty(0, dtype=np.int64)
        feats = self.features(x[:-1])
        with torch.inference_mode():
            return self.head.greedy_chain(torch.as_tensor(x), feats, k).numpy()

    # --- replay -----------------------------------------------------------------------------------
    def chain_runs(self, x: np.ndarray, t_lo: int, t_hi: int, k: int) -> np.ndarray:
        """runs[t - t_lo] for t in t_lo..t_hi-1: how many of the k drafts of the chain made from position t
        (context x[..t+1]) equal x[t+2], x[t+3], ... (drafts past the end of x never match)."""
        torch = self.torch
        s = len(x)
        runs = np.zeros(t_hi - t_lo, dtype=np.int64)
        tokens = torch.as_tensor(x)[None]
        valid = torch.ones(1, s, dtype=torch.bool)
        with torch.inference_mode():
            feats = self.features(x)[None]
            for a in range(t_lo, t_hi, self.block):
                b = min(a + self.block, t_hi)
                rows = np.arange(a, b)
                alive = np.ones(b - a, dtype=bool)
                for j, lg in enumerate(self.head.iter_ttt(tokens, feats, valid, k, rows=slice(a, b))):
                    pred = self.draft_ids[lg[0].argmax(-1).numpy()]
                    tgt = rows + 2 + j
                    alive &= (tgt < s) & (pred == x[np.minimum(tgt, s - 1)])
                    runs[a - t_lo : b - t_lo] += alive
                    if not alive.any():
                        break
        return runs

    def replay(
        self, prompt_ids: np.ndarray, output_ids: np.ndarray, k_max: int
    ) -> tuple[np.ndarray, np.ndarray]:
        prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
        output_ids = np.asarray(output_ids, dtype=np.int64)
        n, plen = len(output_ids), len(prompt_ids)
        x = np.concatenate([prompt_ids, output_ids])
        ends = plen + np.arange(n)  # context length T at position p
        kk = np.full(n, k_max, dtype=np.int64)
        if self.max_model_len is not None:
            kk = np.clip(np.minimum(kk, self.max_model_len - ends), 0, None)
        kk[ends < 2] = 0  # the first draft comes from position T-2
        acc = np.ones(n, dtype=np.int32)
        use = np.flatnonzero(kk > 0)
        if len(use) == 0:
            return acc, kk.astype(np.int32)
        t = ends[use] - 2
        t_lo, t_hi = int(t.min()), int(t.max()) + 1
        runs = self.chain_runs(x, t_lo, t_hi, int(kk[use].max()))
        acc[use] = 1 + np.minimum(runs[t - t_lo], kk[use])
        return acc, kk.astype(np.int32)
