"""Roofline cost models from first principles: a model's configuration and a GPU's datasheet figures
(src/speclab/presets/roofline.toml), no measurement.

One forward pass over `batched` new tokens with `kv` cached tokens in the batch reads every weight once,
reads the KV cache and writes the new tokens' KV, and does 2 FLOPs per weight per token plus attention
(4 * heads * head_dim FLOPs per layer per cached token attended, one query per request assumed):

    memory_s  = (weight_bytes + kv * kv_bytes_per_token + batched * kv_bytes_per_token) / bandwidth
    compute_s = (2 * matmul_params * batched + 4 * layers * heads * head_dim * kv) / peak_flops

The roofline time is max(memory_s, compute_s) (perfect overlap). speclab's cost-model form is linear, so a
preset uses the additive bound memory_s + compute_s instead: const = weight_bytes / bandwidth, kv = (the KV
bytes per token / bandwidth + attention FLOPs per cached token / peak), batched = (2 * matmul_params / peak
+ kv_bytes_per_token / bandwidth). Both are printed by `compare`; see docs/cost-models.md ("Roofline presets").
Drafters: model drafters (EAGLE heads, draft models) in the chained form, one pass of the drafter per draft
position; n-gram and suffix as the study's verify fraction. The per-step overhead (CPU scheduling, sampling)
is not a roofline quantity: the presets keep the study's measured 1.2 ms.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speclab.costmodel.model import CostModel, DraftCost, TargetCost
from speclab.costmodel.registry import get_cost_model
from speclab.errors import ConfigError

DATA = Path(__file__).resolve().parent.parent / "presets" / "roofline.toml"
PRESET_DIR = Path(__file__).resolve().parent.parent / "presets" / "cost_models"
STUDY_OVERHEAD_S = 1.20683946e-03  # the study's fixed per-step overhead (not a roofline quantity)
NGRAM_FRACTION = 0.005875  # the study's n-gram drafting, a fraction of the verify time
DTYPE_BYTES = 2  # bf16, as the study ran


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float
    mem_bandwidth: float
    description: str = ""


@dataclass(frozen=True)
class Architecture:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    lm_head_vocab: int | None = None
    extra_params: int = 0
    tp: int = 1

    @property
    def layer_params(self) -> int:
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        return attn + 3 * self.hidden * self.intermediate

    @property
    def matmul_params(self) -> int:
        """Weights every token multiplies with: the layers, extra projections and the output layer."""
        return (
            self.layers * self.layer_params
            + self.extra_params
            + self.hidden * (self.lm_head_vocab or self.vocab)
        )

    @property
    def weight_bytes(self) -> int:
        """Bytes read per forward (the input embedding only for the batch's rows: not counted)."""
        return DTYPE_BYTES * self.matmul_params

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES

    @property
    def attn_flops_per_cached_token(self) -> int:
        return 4 * self.layers * self.heads * self.head_dim


def load_data(path: Path = DATA) -> tuple[dict[str, Hardware], dict[str, Architecture], dict[str, dict]]:
    d = tomllib.loads(path.read_text())
    hw = {k: Hardware(name=k, **v) for k, v in d.get("hardware", {}).items()}
    arch = {k: Architecture(name=k, **v) for k, v in d.get("architecture", {}).items()}
    return hw, arch, d.get("presets", {})


def _get(table: dict, name: str, what: str):
    if name not in table:
        raise ConfigError(f"unknown {what} {name!r} (known: {', '.join(sorted(table))})")
    return table[name]


def forward_times(a: Architecture, h: Hardware, kv, batched) -> tuple[np.ndarray, np.ndarray]:
    """(memory_s, compute_s) of one forward; `a.tp` GPUs add up their bandwidth and FLOP/s."""
    kv, batched = np.asarray(kv, dtype=float), np.asarray(batched, dtype=float)
    mem = (a.weight_bytes + (kv + batched) * a.kv_bytes_per_token) / (h.mem_bandwidth * a.tp)
    comp = (2.0 * a.matmul_params * batched + a.attn_flops_per_cached_token * kv) / (h.peak_flops * a.tp)
    return mem, comp


def linear_terms(a: Architecture, h: Hardware) -> tuple[float, float, float]:
    """(kv, batched, const) of the additive bound memory_s + compute_s, which is linear."""
    bw, pk = h.mem_bandwidth * a.tp, h.peak_flops * a.tp
    kv = a.kv_bytes_per_token / bw + a.attn_flops_per_cached_token / pk
    batched = 2.0 * a.matmul_params / pk + a.kv_bytes_per_token / bw
    return kv, batched, a.weight_bytes / bw


def roofline_cost_model(target: str, hardware: str, drafters: dict[str, str] | None = None) -> CostModel:
    hws, archs, presets = load_data()
    h, a = _get(hws, hardware, "hardware"), _get(archs, target, "architecture")
    drafters = presets.get(target, {}) if drafters is None else drafters
    kv, batched, const = linear_terms(a, h)
    draft = {"ngram": DraftCost("verify_fraction", fraction=NGRAM_FRACTION),
             "suffix": DraftCost("verify_fraction", fraction=NGRAM_FRACTION)}  # fmt: skip
    for method, name in drafters.items():
        d = _get(archs, name, "architecture")
        dkv, dbatched, dconst = linear_terms(d, h)
        # chained: per pass the drafter's weights and the batch's KV in its layers; per draft token its FLOPs
        draft[method] = DraftCost("chained", kv=dkv, num_spec=dbatched, const=dconst)
    return CostModel(
        name=f"roofline-{target}-{hardware}",
        target=TargetCost(kv=kv, batched=batched, const=const),
        draft=draft,
        overhead_per_step=STUDY_OVERHEAD_S,
        description=f"Roofline (additive memory + compute bound) for {target} on {h.description or hardware}; "
        f"drafters {', '.join(f'{m}={n}' for m, n in drafters.items()) or 'none'}; overhead: the study's",
        source="speclab.costmodel.roofline from presets/roofline.toml (datasheet + config figures)",
    )


def write_presets(out_dir: Path = PRESET_DIR) -> list[Path]:
    hws, _, presets = load_data()
    paths = []
    header = "# Generated by `python -m speclab.costmodel.roofline --write-presets`; do not edit by hand."
    for target in presets:
        for hw in hws:
            cm = roofline_cost_model(target, hw)
            p = out_dir / f"{cm.name}.toml"
            p.write_text(cm.to_toml(header))
            paths.append(p)
    return paths


def compare(target: str = "llama3.1-8b", hardware: str = "h100", reference: str = "llama3.1-8b-h100",
            context: int = 1024, batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128),
            tokens_per_request: int = 1) -> list[dict[str, float]]:  # fmt: skip
    """Per batch size: one decode/verify forward of B requests each holding `context` KV tokens and
    verifying `tokens_per_request` tokens: the roofline (max), the additive bound and the reference cost
    model's target time (seconds), and the ratios to the reference."""
    hws, archs, _ = load_data()
    a, h = _get(archs, target, "architecture"), _get(hws, hardware, "hardware")
    ref = get_cost_model(reference)
    rows = []
    for b in batch_sizes:
        kv, t = b * context, b * tokens_per_request
        mem, comp = forward_times(a, h, kv, t)
        r = float(ref.target_time(kv, t))
        rows.append({"batch": b, "roofline_s": float(max(mem, comp)), "additive_s": float(mem + comp),
                     "reference_s": r, "roofline_ratio": float(max(mem, comp)) / r,
                     "additive_ratio": float(mem + comp) / r, "compute_bound": bool(comp > mem)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="Roofline cost models: compare with a fitted model, or write presets."
    )
    ap.add_argument("--target", default="llama3.1-8b")
    ap.add_argument("--hardware", default="h100")
    ap.add_argument("--reference", default="llama3.1-8b-h100")
    ap.add_argument("--context", type=int, default=1024, help="KV tokens per request")
    ap.add_argument("--tokens-per-request", type=int, default=1, help="1 = decode; k+1 = verify k drafts")
    ap.add_argument("--write-presets", action="store_true")
    args = ap.parse_args(argv)
    if args.write_presets:
        for p in write_presets():
            print(p)
        return
    a = roofline_cost_model(args.target, args.hardware)
    ref = get_cost_model(args.reference).target
    ref_kv, ref_b, ref_c = ref.kv, ref.batched, ref.const
    print(f"{a.name} vs {args.reference}: target terms (additive roofline / reference)")
    print(f"  kv      {a.target.kv:.4e} / {ref_kv:.4e} = {a.target.kv / ref_kv:.3f}")
    print(f"  batched {a.target.batched:.4e} / {ref_b:.4e} = {a.target.batched / ref_b:.3f}")
    print(f"  const   {a.target.const:.4e} / {ref_c:.4e} = {a.target.const / ref_c:.3f}")
    print(f"forward, {args.context} KV tokens and {args.tokens_per_request} new token(s) per request (ms):")
    print(
        f"{'batch':>5} {'roofline':>9} {'additive':>9} {'reference':>9} {'roof/ref':>8} {'add/ref':>8}  bound"
    )
    for r in compare(
        args.target, args.hardware, args.reference, args.context, tokens_per_request=args.tokens_per_request
    ):
        print(f"{r['batch']:>5} {1e3 * r['roofline_s']:>9.3f} {1e3 * r['additive_s']:>9.3f} {1e3 * r['reference_s']:>9.3f} "
              f"{r['roofline_ratio']:>8.3f} {r['additive_ratio']:>8.3f}  {'compute' if r['compute_bound'] else 'memory'}")  # fmt: skip


if __name__ == "__main__":
    main()
