"""Judging answer text: the number an answer gives, and whether the text is sane.

Pure functions over the engine's real output, returning data. Gate 3 uses them
on every answer, so "HTTP 200 with some text" never passes on its own: the
number must be the right one and the text must not be runaway repetition,
garbage characters or cut short.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

__all__ = ["extract_number", "NumberJudgement", "judge_number", "sanity_problems", "mentions"]

# 1,234 or 1234 or -3.5; a thousands group only when it is really one (so "2,3" is two numbers)
_NUMBER = re.compile(r"(?<![\w.])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")
# where a model states its final answer, strongest first
_FINAL_MARKERS = (
    re.compile(r"\\boxed\{([^{}]*)\}"),
    re.compile(r"answer\s*(?:is|:|=)\s*[*_`$\\(]*\s*([^\n]*)", re.IGNORECASE),
    re.compile(r"=\s*([^=\n]*)$", re.MULTILINE),
)


def _numbers(text: str) -> list[float]:
    out = []
    for m in _NUMBER.finditer(text):
        s = m.group(0).replace(",", "").replace("−", "-")
        try:
            out.append(float(s))
        except ValueError:
            continue
    return out


def extract_number(text: str) -> float | None:
    """The number an answer gives as its result, or None when it gives none.

    "2 + 3 = 5" -> 5 (after the last '='), "The answer is **56**." -> 56,
    "\\boxed{391}" -> 391, "5,555" -> 5555; otherwise the last number in the text,
    because models restate the question before answering it.
    """
    if not text:
        return None
    body = text.replace("**", "").replace("`", "")
    for marker in _FINAL_MARKERS:
        found = [m.group(1) for m in marker.finditer(body)]
        for tail in reversed(found):
            nums = _numbers(tail)
            if nums:
                return nums[0]
    nums = _numbers(body)
    return nums[-1] if nums else None


@dataclass(frozen=True)
class NumberJudgement:
    ok: bool
    expected: float
    parsed: float | None
    detail: str


def judge_number(text: str, expected: float, rel_tol: float = 1e-9) -> NumberJudgement:
    """Is the number the answer gives the expected one?"""
    parsed = extract_number(text)
    if parsed is None:
        return NumberJudgement(False, expected, None, f"no number in the answer {_clip(text)!r}")
    ok = math.isclose(parsed, expected, rel_tol=rel_tol, abs_tol=1e-9)
    detail = (f"answered {_fmt(parsed)} as expected" if ok
              else f"wrong answer: expected {_fmt(expected)}, the engine said {_fmt(parsed)} in {_clip(text)!r}")
    return NumberJudgement(ok, expected, parsed, detail)


def mentions(text: str, word: str) -> bool:
    """Does the text contain the word as a whole word (case-insensitive)?"""
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text or "", re.IGNORECASE) is not None


# a unit of 1..50 characters repeated back to back at least 4 times
_RUN = re.compile(r"(.{1,50}?)\1{3,}", re.DOTALL)
_RUN_MIN_CHARS = 40          # "----" or "ha ha ha" is fine; 40+ characters of one loop is not
_LINE_REPEATS_MAX = 2        # the same sentence three times is a loop even with text between
_MARKDOWN = set("|-*_#=>`")
_NAN = re.compile(r"(?<![A-Za-z])(?:NaN|nan|NAN|inf|Infinity)(?![A-Za-z])")


def _bad_char(ch: str) -> bool:
    if ch in "\n\r\t":
        return False
    if ch == "\ufffd":
        return True
    cat = unicodedata.category(ch)
    return cat in ("Cc", "Cs", "Co", "Cn")


def sanity_problems(text: str | None, finish_reason: str | None, *,
                    allowed_finish: tuple[str, ...] = ("stop",), allow_empty: bool = False) -> list[str]:
    """Why this answer is not a sane one, or [] when it is.

    Catches: no text; replacement or control characters (bytes decoded wrongly,
    a broken detokenizer); NaN/inf tokens (logits gone bad); runaway repetition;
    and a finish_reason other than the expected ones (``length`` on a short
    answer means the model never stopped).
    """
    problems: list[str] = []
    text = text or ""
    if finish_reason not in allowed_finish:
        if finish_reason == "length":
            problems.append("finish_reason 'length': cut off at max_tokens where a short answer was asked")
        else:
            problems.append(f"finish_reason {finish_reason!r}, expected {' or '.join(map(repr, allowed_finish))}")
    if not text.strip():
        if not allow_empty:
            problems.append("empty answer")
        return problems
    bad = [ch for ch in text if _bad_char(ch)]
    if bad:
        names = sorted({f"U+{ord(c):04X}" for c in bad})
        problems.append(f"{len(bad)} garbage character(s) ({', '.join(names[:5])})")
    nan = _NAN.findall(text)
    if nan:
        problems.append(f"NaN/inf token(s) in the answer ({nan[0]!r} x{len(nan)})")
    # markdown structure (tables, rules, emphasis) is not garbage; a line of $%^& is
    counted = [ch for ch in text if not ch.isspace() and ch not in _MARKDOWN]
    letters = sum(ch.isalnum() for ch in counted)
    if len(counted) >= 8 and letters / len(counted) < 0.15:
        problems.append(f"mostly symbols: {letters} letters/digits in {len(counted)} visible characters")
    for m in _RUN.finditer(text):
        if len(m.group(0)) >= _RUN_MIN_CHARS:
            problems.append(f"runaway repetition: {m.group(1)!r} x{len(m.group(0)) // len(m.group(1))}")
            break
    else:
        lines = [ln.strip() for ln in re.split(r"[\n.!?]+", text) if len(ln.strip()) >= 20]
        for ln in set(lines):
            n = lines.count(ln)
            if n > _LINE_REPEATS_MAX:
                problems.append(f"runaway repetition: the sentence {_clip(ln, 40)!r} x{n}")
                break
    return problems


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _clip(text: str, n: int = 80) -> str:
    text = text or ""
    return text if len(text) <= n else text[: n - 3] + "..."
