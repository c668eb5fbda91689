"""``dpaudit audit scores``: read a scores file, check what its provenance allows, audit it.

A scores file says how much it can about where its member bits came from. One written by
``dpaudit attack mia --scores-out`` carries the columns ``attack`` and ``record_id``
(:data:`attacks.result.SCORE_COLUMNS`): its bits are the members and holdout records of *one*
trained model. Those are not independent trials of one neighbouring pair (what ``--design
multi-run`` asserts; Jagielski et al. 2020, arXiv:2006.07709) nor canaries included independently
with probability 1/2 in one run (``--design canaries``; Steinke, Nasr & Jagielski 2023,
arXiv:2305.08846, Theorem 3.1), so a bound from them is an estimate. Such a file is audited under a
formal design only when the user vouches for it (``trust_design``), and the result then says the
design was declared by the user, not checked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attacks.result import SCORE_COLUMNS
from dpaudit import numfmt
from dpaudit.errors import InputError
from dpaudit.fileio import check_input_file
from dpaudit.validation import shown

# The designs whose bound is formal (see dpaudit.audit.result.is_formal): the ones a file's
# provenance can contradict.
FORMAL_DESIGNS = ("multi-run", "canaries")
ATTACK_MIA = "attack-mia"


@dataclass(frozen=True)
class ScoreFile:
    """The ``member`` (0/1) and ``score`` columns of a scores file and what produced them.

    ``source`` is "attack-mia" for a file written by ``dpaudit attack mia --scores-out`` (it has the
    ``attack`` and ``record_id`` columns), else None (a file of the user's own making); ``attack``
    names the attack whose scores it holds (None when unknown).
    """

    path: Path
    member: np.ndarray
    score: np.ndarray
    source: str | None = None
    attack: str | None = None


def read_score_file(path: Path) -> ScoreFile:
    """Read a CSV (columns ``member``, ``score``), NPZ (arrays of those names) or JSON (an object of those two
    lists, or a list of records with those keys) scores file; a ``.npy`` file (one unnamed array) is refused.

    The ``attack``/``record_id`` columns that ``attack mia`` writes are recognised as its provenance.
    A file holding several attacks' scores is refused: each record would count once per attack.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: expected a CSV or NPZ file of scores, got a directory")
    check_input_file(path)  # a pipe or a device is named as such, never opened
    columns = _read_columns(path)
    member, score = _numeric(path, "member", columns["member"]), _numeric(path, "score", columns["score"])
    _check_values(path, member, score)
    if not all(c in columns for c in SCORE_COLUMNS):
        return ScoreFile(path, member, score)
    attacks = sorted({str(a) for a in np.asarray(columns["attack"]).tolist()})
    if len(attacks) > 1:
        raise InputError(
            f"{path}: holds the scores of {len(attacks)} attacks ({', '.join(attacks)}); each record would count "
            "once per attack: audit one attack's scores at a time"
        )
    # One row per record: a record listed twice (files concatenated, an append run twice) would count as two
    # trials, and under a formal design (--trust-design) two trials shrink the Clopper-Pearson interval.
    ids, first, counts = np.unique(np.asarray(columns["record_id"]).astype(str), return_index=True, return_counts=True)
    if len(ids) < len(member):
        i = int(np.argmax(counts))
        raise InputError(
            f"{path}: record_id {ids[i]} appears {counts[i]} times (first in row {first[i] + 1}); "
            f"{len(member) - len(ids)} duplicate row(s): each record would count more than once"
        )
    return ScoreFile(path, member, score, source=ATTACK_MIA, attack=attacks[0] if attacks else None)


def audit_score_file(path: Path, *, design: str = "membership", trust_design: bool = False, **audit_kwargs: Any):
    """:func:`dpaudit.audit.audit_scores` on a scores file, refusing a formal design its provenance contradicts.

    ``design`` "multi-run" or "canaries" on a file written by ``attack mia`` raises :class:`InputError`
    (its bits are one model's members and holdout records, so the bound is an estimate) unless
    ``trust_design``; with it, the result's notes and ``details["design_declared_by_user"]`` say that
    the design was declared by the user and not checked. ``audit_kwargs`` go to ``audit_scores``.
    """
    from dpaudit.audit import audit_scores

    scores = read_score_file(path)
    contradicted = scores.source == ATTACK_MIA and design in FORMAL_DESIGNS
    if contradicted and not trust_design:
        raise InputError(
            f"{path} was written by `dpaudit attack mia` ({scores.attack} scores with record ids): its member bits "
            f"are the members and holdout records of one model, not {_DESIGN_WORDS[design]}, so a bound from it is "
            "an estimate; use --design membership, or --trust-design if you really produced these scores that way"
        )
    result = audit_scores(scores.score, scores.member, design=design, **audit_kwargs)
    details = {**result.details, "score_file_source": scores.source}
    inverted = _inverted_note(scores) if audit_kwargs.get("alternative", "greater") == "greater" else None
    if inverted is not None:
        result = dataclasses.replace(result, notes=(inverted, *result.notes))
    if not contradicted:
        return dataclasses.replace(result, details=details)
    note = (
        f"design {design!r} declared by the user (--trust-design) for a file written by `dpaudit attack mia` "
        f"({scores.attack} scores): not checked; the bound is formal only if the scores really are "
        f"{_DESIGN_WORDS[design]}"
    )
    details["design_declared_by_user"] = True
    return dataclasses.replace(result, notes=(note, *result.notes), details=details)


# Level of the test that the members' scores are lower than the non-members' (see _inverted_note).
INVERTED_ALPHA = 0.01


def _inverted_note(scores: ScoreFile) -> str | None:
    """A note when the members' scores are significantly *lower* than the non-members' (one-sided Mann–Whitney
    test, Mann & Whitney 1947, at :data:`INVERTED_ALPHA`): scores read as higher = member, so a file of losses
    (lower = member, the convention of the loss attack, Yeom et al. 2018) audits as no leakage at all. The audit
    itself is unchanged (a one-sided test chosen before the data); flipping the sign after seeing this is a
    choice made on the data, which ``--two-sided`` pays for (α/2 per direction)."""
    from scipy.stats import mannwhitneyu

    member = scores.member.astype(bool)
    u = mannwhitneyu(scores.score[member], scores.score[~member], alternative="less")
    if u.pvalue >= INVERTED_ALPHA:
        return None
    auc = float(u.statistic) / (member.sum() * (~member).sum())  # P(member's score > non-member's), ties 1/2
    return (
        f"the members' scores are lower than the non-members' (P(member > non-member) = {auc:.3f}, one-sided "
        f"Mann–Whitney {numfmt.p_value(u.pvalue, 2)}), but scores are read as higher = member: if these are losses, "
        "give their negatives as the score; if the direction is not known in advance, rerun with --two-sided"
    )


_DESIGN_WORDS = {
    "multi-run": "one score per independent training run on D or D' (multi-run)",
    "canaries": "canaries of one run each included independently with probability 1/2 (canaries)",
}


def _read_columns(path: Path) -> dict[str, np.ndarray]:
    suffix = path.suffix.lower()
    if suffix == ".npy":  # np.load would give one unnamed array: which column is the member bit is a guess
        raise InputError(
            f"{path}: a .npy file holds one unnamed array; save the columns by name: "
            "np.savez(FILE.npz, member=..., score=...), or a CSV with columns member,score"
        )
    if suffix == ".json":
        return _json_columns(path)
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                missing = [k for k in ("member", "score") if k not in npz.files]
                if missing:
                    raise InputError(
                        f"{path}: missing array(s) {', '.join(missing)}; found {', '.join(npz.files) or 'none'}"
                    )
                return {k: npz[k] for k in npz.files}
        except InputError:
            raise
        except Exception as e:  # not a zip, object arrays (pickles refused), truncated file, ...
            raise InputError(f"{path}: not a readable NPZ file ({type(e).__name__}: {e})") from None
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except Exception as e:
        raise InputError(f"{path}: not a readable CSV file ({type(e).__name__}: {e})") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in ("member", "score") if c not in df.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(df.columns) or 'none'}")
    return {c: df[c].to_numpy() for c in df.columns}


def _json_columns(path: Path) -> dict[str, np.ndarray]:
    """Columns of a JSON scores file: ``{"member": [...], "score": [...]}`` or a list of
    ``{"member": m, "score": s}`` records (other keys, e.g. record_id, kept as columns)."""
    from dpaudit.validation import read_json

    data = read_json(path)  # bounded parsing of an untrusted file
    if isinstance(data, list) and all(isinstance(r, dict) for r in data):
        keys = list(dict.fromkeys(k for r in data for k in r))
        data = {k: [r.get(k) for r in data] for k in keys}
    if not isinstance(data, dict):
        raise InputError(
            f'{path}: expected a JSON object {{"member": [...], "score": [...]}} or a list of '
            f'{{"member": m, "score": s}} records, got a JSON {type(data).__name__}'
        )
    missing = [k for k in ("member", "score") if k not in data]
    if missing:
        found = ", ".join(shown(k) for k in list(data)[:10]) or "none"
        raise InputError(f"{path}: missing key(s) {', '.join(missing)}; found {found}")
    columns = {}
    for k, v in data.items():
        if not isinstance(v, list):
            raise InputError(f"{path}: {shown(k)} must be a list, got a JSON {type(v).__name__}")
        columns[str(k)] = np.array(v, dtype=object)
    return columns


def _check_values(path: Path, member: np.ndarray, score: np.ndarray) -> None:
    # audit_scores checks the arrays too, but cannot name the file or its row (rows count from 1 after the header).
    if len(member) != len(score):
        raise InputError(f"{path}: member and score differ in length ({len(member)} vs {len(score)})")
    bad = np.flatnonzero(~np.isfinite(score))
    if len(bad):
        raise InputError(f"{path}: score must be finite; {len(bad)} NaN/inf value(s), the first in row {bad[0] + 1}")
    bad = np.flatnonzero(~np.isin(member.astype(float), (0.0, 1.0)))
    if len(bad):
        raise InputError(f"{path}: member must be 0/1 (or true/false); found {member[bad[0]]:g} in row {bad[0] + 1}")
    n_members = int(np.count_nonzero(member))
    if n_members in (0, len(member)):
        raise InputError(
            f"{path}: member has a single class ({n_members} members, {len(member) - n_members} non-members); "
            "an audit needs both"
        )


def _numeric(path: Path, name: str, values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim != 1:
        raise InputError(f"{path}: {name} must be one-dimensional, got shape {values.shape}")
    if values.dtype == bool:
        return values
    try:
        return values.astype(float)
    except (TypeError, ValueError):
        pass
    for i, v in enumerate(values):
        try:
            float(v)
        except (TypeError, ValueError):
            raise InputError(f"{path}: non-numeric {name} {v!r} in row {i + 1}") from None
    raise InputError(f"{path}: {name} is not numeric")
