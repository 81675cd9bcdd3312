"""Role markup derived from Jinja chat templates (no server, no transformers)."""

import pytest

from radixlm.lang import chat_template as ct

# SmolLM2-Instruct's template (ChatML with a default system prompt).
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
NO_SYSTEM = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ raise_exception('no system role') }}"
    "{% endif %}{{ '<' + message['role'] + '>' + message['content'] + '</s>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<assistant>' }}{% endif %}"
)


def test_chatml_with_default_system_prompt():
    t = ct.derive(ct.jinja_renderer(SMOLLM2))
    assert t.roles == {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ("system", "user", "assistant")}
    assert t.default_system_prompt == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert t.stop_str == "<|im_end|>"


def test_bos_added_by_the_tokenizer_is_stripped():
    render = ct.jinja_renderer(LLAMA3, {"bos_token": "<|begin_of_text|>"})
    t = ct.derive(render, bos_token="<|begin_of_text|>")
    assert t.prefix("system") == "<|start_header_id|>system<|end_header_id|>\n\n"
    assert t.roles["assistant"] == ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")
    assert t.stop_str == "<|eot_id|>" and t.default_system_prompt is None


def test_template_without_system_role_reuses_the_user_markup():
    t = ct.derive(ct.jinja_renderer(NO_SYSTEM))
    assert t.roles["user"] == ("<user>", "</s>") and t.roles["system"] == t.roles["user"]
    assert t.roles["assistant"] == ("<assistant>", "</s>") and t.stop_str == "</s>"


def test_sources(tmp_path, stories_path):
    assert ct.from_model_info({"chat_template": SMOLLM2}).stop_str == "<|im_end|>"
    assert ct.from_tokenizer_path(stories_path) is ct.DEFAULT  # stories260K has no template
    assert ct.from_model_info({"model_path": str(tmp_path / "missing")}) is ct.DEFAULT
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    (tmp_path / "chat_template.jinja").write_text(SMOLLM2)
    assert ct.from_tokenizer_path(str(tmp_path)).roles["user"][0] == "<|im_start|>user\n"
    assert ct.get_template("chatml").stop_str == "<|im_end|>"
    with pytest.raises(ValueError):
        ct.get_template("nope")
