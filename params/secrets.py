"""What a profile may not hold in clear: credentials in the results store's URI, an engine's env or its flags.

A profile is copied whole into the profile ConfigMap, its ``results_uri`` into the WorkflowTemplate's
``results-uri`` parameter, and an engine's env into the local deploy verdict and the report: anything
secret in it would be readable by everyone who can read those. So a value that is a credential is
refused, with the way to reference a Secret instead. What counts as a credential:

- a variable (or flag, or URI query parameter) whose name says so: ``*_TOKEN``, ``*SECRET*``,
  ``*PASSWORD*``/``*PASSWD*``/``*PASSPHRASE*``, ``*_KEY``, ``*ACCESS_KEY*`` (``HF_TOKEN``,
  ``AWS_SECRET_ACCESS_KEY``, ``OPENAI_API_KEY``, ``?access_key=``, ``--hf-token``);
- a value shaped like a well-known token whatever its name (Hugging Face ``hf_…``, AWS ``AKIA…``,
  GitHub ``ghp_…``/``github_pat_…``, ``sk-…`` API keys, Slack ``xox?-…``, a PEM private key);
- a URI's ``user:password@``.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

__all__ = ["credential_name", "credential_value", "uri_credential", "RESULTS_SECRET", "results_secret_hint"]

RESULTS_SECRET = "gauntlet-results"     # workflows/render.py: envFrom of every step that writes results

_NAME = re.compile(r"(^|_)TOKEN$|(^|_)SECRET|PASSWORD|PASSWD|PASSPHRASE|(^|_)KEY$|(^|_)ACCESS_KEY")
_VALUE = re.compile(
    r"\bhf_[A-Za-z0-9]{30,}|\b(AKIA|ASIA)[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{30,}|\bgithub_pat_\w{20,}"
    r"|\bsk-[A-Za-z0-9_-]{20,}|\bxox[abprs]-[A-Za-z0-9-]{10,}|-----BEGIN [A-Z ]*PRIVATE KEY-----")


def credential_name(name: str) -> bool:
    """Whether a variable, flag or query parameter of this name holds a credential (case and '-' ignored)."""
    return bool(_NAME.search(name.upper().replace("-", "_")))


def credential_value(value: str) -> bool:
    """Whether ``value`` contains a well-known token's shape, whatever it is called."""
    return bool(_VALUE.search(value))


def uri_credential(uri: str) -> str | None:
    """What in ``uri`` is a credential (``"the password in user:password@"``, ``"the query parameter
    secret_key="``, ``"a token"``), or None."""
    try:
        parts = urlsplit(uri)
        password = parts.password
    except ValueError:          # not a URI: a local path, or refused by the store when used
        parts, password = None, None
    if password is not None:
        return "the password in user:password@"
    if parts is not None:
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if credential_name(key) and value:
                return f"the query parameter {key}="
    if credential_value(uri):
        return "a token"
    return None


def results_secret_hint() -> str:
    return (f"keep credentials in the Secret {RESULTS_SECRET} (`kubectl create secret generic {RESULTS_SECRET} "
            "--from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=...`): every step that "
            "reads or writes results gets its keys as environment variables, which pyarrow's filesystems read "
            "(locally: export them)")
