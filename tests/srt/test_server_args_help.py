"""``radixlm serve --help`` states each default once (issue: "(default: no limit) (default: None)")."""

from __future__ import annotations

import argparse

from radixlm.srt.server_args import ServerArgs


def test_each_option_states_its_default_at_most_once():
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    helps = {a.option_strings[0]: a.help or "" for a in parser._actions if a.option_strings}
    assert "--model-path" in helps
    assert {opt: h for opt, h in helps.items() if h.count("default") > 1} == {}
    assert {opt: h for opt, h in helps.items() if "(default: None)" in h} == {}
    assert helps["--port"].endswith("(default: 30000)")
    assert "no limit" in helps["--request-timeout"]
