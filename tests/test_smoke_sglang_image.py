"""Gate 3's ``invalid-image`` on SGLang, decided by SGLang's own code (the installed 0.5.23, .ci/install-sglang.sh).

Gate 3 sends a PNG cut off mid-IDAT (``steps/client/probe_image.py`` ``broken_png``, as a data URL) and requires a
4xx. Whether SGLang answers 4xx or 5xx depends on one fact: the exception its image loader raises for it is in its
own ``CLIENT_MEDIA_EXCEPTIONS`` (``sglang.srt.utils.common``: client media errors, refused with 400) or not
(anything else becomes a 500 "Internal server error"). Pillow raises a plain ``OSError("image file is
truncated")`` for this PNG; SGLang 0.5.23's ``_fully_load_pil_image`` forces the decode inside ``load_image``
and re-raises it as ``ValueError``, which is in the tuple. These tests call SGLang's own functions on the very
bytes Gate 3 sends, along both paths its Kimi K3 processor takes (``KimiK3ImageProcessor``: the preprocess
cache's ``decode_media_snapshot``, on by default, 256 MiB; ``_load_single_item`` with the cache off), and then
SGLang's own chat handler's mapping of that exception to an HTTP status. When an SGLang upgrade changes any of
this, they fail and say what Gate 3 will see (docs/smoke-expectations.md, "invalid (truncated) image").

The one stand-in is the tokenizer manager handed to ``OpenAIServingChat._handle_non_streaming_request``: it
raises what SGLang's own loader raised (the real one needs the model and a GPU scheduler, not on this CPU).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import require_sglang

from gauntlet.steps.client.probe_image import broken_png, data_url, solid_png

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sglang():
    require_sglang()
    import sglang
    from sglang.srt.utils import common
    return sglang, common


def _raised(fn, *args, **kw) -> BaseException:
    try:
        fn(*args, **kw)
    except Exception as exc:    # what SGLang's loader raises is the subject of the test
        return exc
    raise AssertionError(f"{getattr(fn, '__qualname__', fn)} loaded Gate 3's truncated PNG without an error")


def test_sglang_load_image_refuses_the_truncated_png_as_client_media(sglang):
    version, common = sglang[0].__version__, sglang[1]
    good, _ = common.load_image(data_url(solid_png("red")))     # the image check's PNG decodes (same call)
    assert good.size == (64, 64) and good.getpixel((1, 1)) == (220, 20, 20)
    exc = _raised(common.load_image, data_url(broken_png()))
    assert isinstance(exc, common.CLIENT_MEDIA_EXCEPTIONS), (
        f"SGLang {version}: load_image raises {type(exc).__name__} ({exc}) for Gate 3's truncated PNG, outside "
        f"CLIENT_MEDIA_EXCEPTIONS {[c.__name__ for c in common.CLIENT_MEDIA_EXCEPTIONS]}: its chat handler will "
        "answer 500, so invalid-image fails on it; declare it in engines.sglang.known_deviations with this reason")
    assert isinstance(exc, ValueError) and "image file is truncated" in str(exc)
    assert isinstance(exc.__cause__, OSError) and not isinstance(exc.__cause__, common.CLIENT_MEDIA_EXCEPTIONS)


def test_kimi_k3_processor_paths_raise_the_client_error(sglang):
    from sglang.srt.multimodal.cache.identity import snapshot_media
    from sglang.srt.multimodal.media_artifacts.base import MediaArtifactCacheMixin
    from sglang.srt.multimodal.processors.kimi_k3 import KimiK3ImageProcessor
    from sglang.srt.managers.schedule_batch import Modality
    from sglang.srt.utils.common import CLIENT_MEDIA_EXCEPTIONS
    url = data_url(broken_png())
    # the preprocess cache is on for Kimi K3 unless --mm-preprocess-cache-size-mb 0: its misses decode here
    assert KimiK3ImageProcessor.auto_mm_preprocess_cache_size_mb > 0
    cached = _raised(MediaArtifactCacheMixin.decode_media_snapshot, KimiK3ImageProcessor, snapshot_media(url),
                     Modality.IMAGE)
    # cache off: base_processor's loader, which turns CLIENT_MEDIA_EXCEPTIONS into ValueError, others RuntimeError
    uncached = _raised(KimiK3ImageProcessor._load_single_item, url, Modality.IMAGE, discard_alpha_channel=False)
    for exc in (cached, uncached):
        assert isinstance(exc, ValueError) and isinstance(exc, CLIENT_MEDIA_EXCEPTIONS), repr(exc)
        assert "image file is truncated" in str(exc)


def test_sglang_chat_handler_answers_that_error_with_400(sglang):
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.utils.common import load_image
    loader_error = _raised(load_image, data_url(broken_png()))

    class _TokenizerManager:      # stand-in: the real one would have run the same loader and raised this
        def generate_request(self, adapted_request, raw_request):
            async def gen():
                raise loader_error
                yield
            return gen()

    chat = OpenAIServingChat.__new__(OpenAIServingChat)
    chat.tokenizer_manager = _TokenizerManager()
    reply = asyncio.run(chat._handle_non_streaming_request(None, None, None))
    body = json.loads(reply.body)
    assert reply.status_code == 400, (reply.status_code, body)
    # SGLang's error shape (serving_base.create_error_response), which Gate 3's error_message reads
    assert body["object"] == "error" and "image file is truncated" in body["message"]
    from gauntlet.steps.client.replies import Exchange, judge_refusal
    ex = Exchange("POST", "/v1/chat/completions", reply.status_code, body, reply.body.decode())
    assert judge_refusal(ex) == []          # Gate 3's own judgement of that reply: a clean refusal
