"""Tool calls under ``tool_choice: required`` or a named function with a grammar: the grammar makes
the whole output calls, so the only region that can fail to parse is the last one, cut by the token
limit before its call's name was whole (``max_tokens`` of a few tokens), or, cut sooner, a piece of
the region's opener (``<``, ``<tool``). ``ForcedParser`` drops either: the reply has no content (the
markup is not an answer; ``content`` is null) and ``finish_reason`` stays ``length``, where the format's
parser alone showed the cut markup (``<tool_call>\\n``, ``<tool``) as content.
"""

from __future__ import annotations

from radixlm.srt.function_call.base import ParserWrapper, RegionScan


class ForcedParser(ParserWrapper):
    """``parser``'s format where, at the end of the output, a region that is not a call is dropped.

    Stateless (one instance serves every choice of a request). Args: parser: the server's tool-call
    parser.
    """

    answers_in_content = False

    def next_region(self, text: str, start: int, final: bool) -> tuple[int, int]:
        region, safe = self.parser.next_region(text, start, final)
        if final and region < 0:
            return -1, start  # after the last region only a cut opener (or the calls' whitespace) can stand
        return region, safe

    def scan_region(self, text: str, start: int, final: bool) -> RegionScan:
        scan = self.parser.scan_region(text, start, final)
        if final and scan.status == "invalid":
            return RegionScan("done", [], len(text))
        return scan
