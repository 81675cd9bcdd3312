"""radixlm.lang: write prompt programs in plain Python; the runtime reuses every shared prefix.

Usage (``import radixlm.lang as rl``)::

    rl.set_default_backend(rl.RuntimeEndpoint("http://127.0.0.1:30000"))

    @rl.function
    def qa(s, question):
        s += rl.user(question)
        s += rl.assistant(rl.gen("answer", max_tokens=64))
        if s["answer"].startswith("I don't"):       # reads block until the value exists
            s += rl.user("Guess anyway.")
            s += rl.assistant(rl.gen("guess", max_tokens=32))

    state = qa.run(question="What is the capital of France?", temperature=0)
    print(state["answer"], state.messages())

Verbs: :func:`function`, :func:`gen` (``gen_int``, ``gen_string``), :func:`select` (choice methods
``token_length_normalized``, ``greedy_token_selection``, ``unconditional_likelihood_normalized``),
roles :func:`system` / :func:`user` / :func:`assistant` (also ``with s.user():``),
:func:`separate_reasoning`. Backends:
:class:`RuntimeEndpoint` (a running server), :class:`Runtime` (launches one), :class:`Engine`
(in-process). Importing this package does not import torch.
"""

from radixlm.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    select,
    separate_reasoning,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixlm.lang.backend import Backend, BackendError
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.lang.defaults import get_default_backend, set_default_backend
from radixlm.lang.engine_backend import Engine
from radixlm.lang.interpreter import ProgramError
from radixlm.lang.program import Program
from radixlm.lang.runtime import Runtime
from radixlm.lang.runtime_endpoint import RuntimeEndpoint
from radixlm.lang.state import ProgramState, ProgramStateGroup

__all__ = [
    "Backend", "BackendError", "ChatTemplate", "ChoicesDecision", "ChoicesSamplingMethod", "Engine",
    "Program", "ProgramError", "ProgramState", "ProgramStateGroup", "Runtime", "RuntimeEndpoint",
    "assistant", "assistant_begin", "assistant_end", "flush_cache", "function", "gen", "gen_int",
    "gen_string", "get_default_backend", "get_server_info", "greedy_token_selection", "select", "separate_reasoning",
    "set_default_backend", "system", "system_begin", "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end",
]
