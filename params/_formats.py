"""The profile's constrained types: ranges of numbers, Kubernetes names, the cron schedule, the time zone.

A name's limit is the tightest one of what it becomes in a rendered document (docs/reliability.md,
"Hostile input"): a profile lint accepts renders documents Kubernetes and Argo accept.
"""

from __future__ import annotations

import functools
import re
import zoneinfo
from datetime import datetime
from typing import Annotated, Any

from cronsim import CronSim, CronSimError
from pydantic import AfterValidator, Field

__all__ = ["Count", "PositiveFloat", "Port", "Seconds", "Tokens", "Fraction", "DnsLabel", "ClusterName",
           "NodeName", "PoolName", "ProfileName", "CaseName", "Cron", "TimeZone", "PROFILE_NAME_MAX"]

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

# gauntlet-<name>-nightly (the CronWorkflow) is at most 52 characters: Argo refuses longer cron workflow
# names, as it appends "-<10-digit time>" to each workflow it creates (a name of at most 63)
PROFILE_NAME_MAX = 52 - len("gauntlet-") - len("-nightly")


# Each use bounds these from above, as ``Annotated[Count, Field(le=64)]`` (a type a checker can read; pydantic
# merges the two Field()s).
Count = Annotated[int, Field(ge=1)]                 # a size or a count where 0 means nothing
PositiveFloat = Annotated[float, Field(gt=0)]       # finite where the model forbids inf/nan


Port = Annotated[int, Field(ge=1, le=65535)]
Seconds = Annotated[int, Field(ge=1, le=30 * 86400, description="seconds, at most 30 days")]
Tokens = Annotated[int, Field(ge=1, le=1 << 24, description="tokens, at most 16M")]
Fraction = Annotated[float, Field(gt=0, le=1)]


def _name(kind: str, pattern: re.Pattern[str], limit: int, what: str) -> Any:
    def check(v: str) -> str:
        if len(v) > limit or not pattern.fullmatch(v):
            shown = v if len(v) <= 40 else v[:37] + "..."
            raise ValueError(f"expected a {kind} of at most {limit} characters ({what}), got {shown!r} "
                             f"({len(v)} characters)")
        return v
    return Annotated[str, AfterValidator(check)]


_LABEL_WHAT = "lower-case letters, digits and '-', starting and ending with a letter or digit"
_SUB_WHAT = "lower-case letters, digits, '-' and '.'"
DnsLabel = _name("DNS-1123 label", _LABEL, 63, _LABEL_WHAT)
ClusterName = _name("DNS-1123 subdomain", _SUBDOMAIN, 253, _SUB_WHAT)
NodeName = _name("node name", _SUBDOMAIN, 63, _SUB_WHAT + "; it is the kubernetes.io/hostname label value")
PoolName = _name("DNS-1123 label", _LABEL, 63 - len("gauntlet-"), _LABEL_WHAT + "; the mutex is gauntlet-<pool>")
ProfileName = _name("DNS-1123 label", _LABEL, PROFILE_NAME_MAX,
                    _LABEL_WHAT + "; gauntlet-<name>-nightly must fit Argo's 52")
# perf-<case> and exp-<variant> become task and template names (seq-perf-<case>: a DNS label of at most 63)
CaseName = _name("DNS-1123 label", _LABEL, 50, _LABEL_WHAT + "; seq-perf-<name> is a template name")

# robfig/cron's descriptors that Argo's parser accepts, as their five fields
_DESCRIPTORS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
                "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
_NAMES = re.compile(r"JAN|FEB|MAR|APR|MAY|JUN|JUL|AUG|SEP|OCT|NOV|DEC|SUN|MON|TUE|WED|THU|FRI|SAT")


def _cron(v: str) -> str:
    expr = _DESCRIPTORS.get(v.strip(), v)
    shown = v if len(v) <= 40 else v[:37] + "..."
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"expected a five-field cron schedule (minute hour day month weekday) or one of "
                         f"{', '.join(_DESCRIPTORS)}, got {shown!r}")
    if any(c in _NAMES.sub("", f.upper()) for f in fields for c in "LW#"):
        raise ValueError(f"{shown!r}: L, W and # are not in Argo's cron syntax (robfig/cron)")
    try:
        CronSim(expr, datetime(2026, 1, 1))
    except (CronSimError, ValueError) as exc:
        raise ValueError(f"not a valid cron schedule: {shown!r} ({exc})") from None
    return v


@functools.cache
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def _zone(v: str) -> str:
    if v not in _zones():
        shown = v if len(v) <= 40 else v[:37] + "..."
        raise ValueError(f"{shown!r} is not a time zone of the IANA database (e.g. Asia/Shanghai, UTC)")
    return v


Cron = Annotated[str, AfterValidator(_cron)]
TimeZone = Annotated[str, AfterValidator(_zone)]
