"""The request set ``vllm bench serve`` sends for one round, drawn by vLLM's own code, and its fingerprint.

"The same requests for every engine" is checked, not assumed: the client's random dataset is seeded, but
its prompts also depend on the tokenizer the client loads and on the server it talks to (``vllm bench
serve`` re-aligns the prompts to the server's ``/tokenize`` when the server counts their tokens otherwise,
``vllm.benchmarks.serve._align_prompts_to_server_tokenizer``). So each round records the digest of the
(prompt, output length) pairs of its request set (:func:`requests_digest`), and the A/B table compares two
engines' numbers for a case only where their digests agree (steps/evidence/report.py). The client's own
``--save-detailed`` JSON keeps the prompts' lengths, not the prompts, so the set is drawn again here with
the client's parser, seeds, tokenizer, ``get_samples`` and alignment (:func:`sample_requests`), in the
interpreter that runs the client in-process. Gate 4's diagnostic client replays the same samples
(steps/engines/sglang_bench.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass

from gauntlet.contract import UsageError
from gauntlet.steps.client.bench import BenchRequest, client_argv, client_parser

__all__ = ["Sample", "sample_requests", "requests_digest"]


@dataclass(frozen=True)
class Sample:
    """One request as the pinned client sends it."""

    prompt: str
    prompt_len: int
    output_len: int


def sample_requests(req: BenchRequest) -> list[Sample]:
    """The requests ``vllm bench serve`` sends for ``req``, drawn by vLLM's own code in this interpreter.

    Mirrors ``vllm.benchmarks.serve.main_async`` for the random dataset: the round's argv parsed by the
    client's own parser, ``random``/``numpy`` seeded, the tokenizer loaded as the client loads it
    (``--trust-remote-code`` included), ``get_samples``, then the client's prompt alignment to the server's
    tokenizer (a no-op when the server has no ``/tokenize`` or agrees).
    """
    import numpy as np
    from vllm.benchmarks import serve
    from vllm.benchmarks.datasets import get_samples
    from vllm.tokenizers import get_tokenizer

    args = client_parser().parse_args(client_argv(req))
    if args.dataset_name != "random":
        raise UsageError(f"the request set is vLLM's random dataset, not {args.dataset_name!r}")
    random.seed(args.seed)
    np.random.seed(args.seed)
    tokenizer = get_tokenizer(args.tokenizer or args.model, tokenizer_mode=args.tokenizer_mode,
                              trust_remote_code=args.trust_remote_code)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):   # the client's prints
        samples = get_samples(args, tokenizer)
        align = getattr(serve, "_align_prompts_to_server_tokenizer", None)
        if align is not None:
            samples = asyncio.run(align(args.base_url, args.model, samples, None))
    out = []
    for s in samples:
        if not isinstance(s.prompt, str):
            raise UsageError(f"vLLM sampled a {type(s.prompt).__name__} prompt; the request set holds text "
                             "prompts only (--random-batch-size 1)")
        out.append(Sample(s.prompt, int(s.prompt_len), int(s.expected_output_len)))
    return out


def requests_digest(samples: Iterable[Sample]) -> str:
    """A fingerprint of a multiset of requests, each its prompt and output length (order-free): equal
    digests, the same requests (pure)."""
    h = hashlib.sha256()
    for item in sorted(hashlib.sha256(f"{s.output_len}\0{s.prompt}".encode()).digest() for s in samples):
        h.update(item)
    return h.hexdigest()[:16]
