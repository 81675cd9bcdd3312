"""Choice methods and select scoring on fixed logprobs (no server)."""

import pytest

import radixlm.lang as rl
from radixlm.lang.choices import mean_logprob
from radixlm.lang.scoring import split_choice_tokens

from .fake_backend import FakeBackend

CHOICES = ["organ", "organism", "antidisestablishmentarianism"]
# [logprob, token id, text] per choice token; designed so each method has a different winner.
COND = [
    [[-0.5, 10, "organ"]],
    [[-0.5, 10, "organ"], [-1.5, 11, "ism"]],
    [[-1.0, 20, "anti"], [-0.2, 21, "dis"], [-0.1, 22, "establish"], [-0.1, 23, "ment"],
     [-0.1, 24, "arian"], [-0.1, 11, "ism"]],
]
UNCOND = [
    [[None, 10, "organ"]],
    [[None, 10, "organ"], [-4.0, 11, "ism"]],
    [[None, 20, "anti"], [-0.5, 21, "dis"], [-0.3, 22, "establish"], [-0.3, 23, "ment"],
     [-0.3, 24, "arian"], [-0.3, 11, "ism"]],
]


def decide(method, uncond=None):
    return method(choices=CHOICES, normalized_prompt_logprobs=[mean_logprob(c) for c in COND],
                  input_token_logprobs=COND, output_token_logprobs=[[] for _ in CHOICES],
                  unconditional_token_logprobs=uncond)


def test_token_length_normalized_picks_best_mean():
    assert [mean_logprob(c) for c in COND] == pytest.approx([-0.5, -1.0, -1.6 / 6])
    assert decide(rl.token_length_normalized).decision == "antidisestablishmentarianism"


def test_greedy_token_selection_breaks_ties_column_by_column():
    d = decide(rl.greedy_token_selection)
    assert d.decision == "organ"
    matrix = d.meta_info["greedy_logprob_matrix"]
    assert matrix[0] == pytest.approx([-0.5] * 6)  # padded with its own mean
    assert matrix[1] == pytest.approx([-0.5, -1.5] + [-1.0] * 4)
    assert matrix[2] == pytest.approx([-1.0, -0.2, -0.1, -0.1, -0.1, -0.1])


def test_unconditional_likelihood_normalized_prefers_the_choice_the_prompt_helps_most():
    d = decide(rl.unconditional_likelihood_normalized, UNCOND)
    assert d.decision == "organism"
    assert d.meta_info["normalized_unconditional_prompt_logprobs"] == pytest.approx([-0.5, 1.0, 0.1 / 6])


def test_unconditional_needs_aligned_lists():
    with pytest.raises(ValueError):
        decide(rl.unconditional_likelihood_normalized, [u[:-1] or u for u in UNCOND])
    with pytest.raises(ValueError):
        decide(rl.unconditional_likelihood_normalized, None)


def test_split_choice_tokens_keeps_a_merged_boundary_token():
    prefix_tail = [[-1.0, 5, "a"], [-2.0, 6, "ti"]]
    plain = [[-1.0, 5, "a"], [-2.0, 6, "ti"], [-0.3, 7, "me"]]
    merged = [[-1.0, 5, "a"], [-0.1, 8, "time"]]  # "ti" + "me" re-tokenized as one token
    assert split_choice_tokens(prefix_tail, plain) == [[-0.3, 7, "me"]]
    assert split_choice_tokens(prefix_tail, merged) == [[-0.1, 8, "time"]]
    assert split_choice_tokens([], plain) == plain


def test_select_on_fake_backend_sends_cache_then_one_batch():
    backend = FakeBackend(scores={"y": -0.1, "e": -0.2, "s": -0.3, "n": -2.0, "o": -2.0})
    decision = backend.select("Q: ok? A: ", ["yes", "no"], rl.token_length_normalized)
    assert decision.decision == "yes"
    meta = decision.meta_info
    assert meta["normalized_prompt_logprobs"] == pytest.approx([-0.2, -2.0])
    assert [[t[2] for t in c] for c in meta["input_token_logprobs"]] == [["y", "e", "s"], ["n", "o"]]
    first, second = backend.bodies
    assert first["sampling_params"]["max_new_tokens"] == 0 and first["text"] == "Q: ok? A: "
    prompt_tokens = len("Q: ok? A: ") + 1
    assert second["logprob_start_len"] == prompt_tokens - 2
    assert second["text"] == ["Q: ok? A: ", "Q: ok? A: yes", "Q: ok? A: no"]


def test_unconditional_select_sends_the_choice_ids_alone():
    backend = FakeBackend(scores={"y": -0.1, "e": -0.2, "s": -0.3, "n": -2.0, "o": -2.0})
    d = backend.select("Q? ", ["yes", "no"], rl.unconditional_likelihood_normalized)
    third = backend.bodies[2]
    assert third["input_ids"] == [[ord(c) for c in "yes"], [ord(c) for c in "no"]]
    assert third["logprob_start_len"] == 0  # SGLang's gap: without it the lists would not line up
    assert d.meta_info["unconditional_token_logprobs"][0][0][0] is None


def test_select_at_the_start_of_a_program():
    """No text before the choices: a BOS is their context; without one the first token cannot be
    scored, which used to give a one-token choice -inf (it lost to any longer choice)."""

    @rl.function
    def first(s):
        s += rl.select("c", choices=["A", "Bye"])

    with_bos = FakeBackend(scores={"A": -0.5, "B": -3.0, "y": -0.1, "e": -0.2})
    state = first.run(backend=with_bos)
    assert state["c"] == "A"
    assert state.get_meta_info("c")["normalized_prompt_logprobs"] == pytest.approx([-0.5, -1.1])
    no_bos = first.run(backend=FakeBackend(scores={"A": -0.5}, bos=False))
    with pytest.raises(ValueError, match="very start of a program cannot score choice 'A'"):
        no_bos.raise_if_error()
