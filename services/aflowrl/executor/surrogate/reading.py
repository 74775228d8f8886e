"""Reading a prompt the way a model would: what is asked, about which problem, with what shown.

:func:`read_request` turns chat messages into a :class:`Reading`: the problem (from the
:class:`~aflowrl.executor.surrogate.index.ProblemIndex`), the kind of request, the form asked for
and the material shown (a solution to review, feedback, candidates, test failures...). It looks
only at the text: nothing about which workflow or node sent it.

How:

1. The prompt is cut into sections at header lines ("Problem:", "Proposed answer:", "Reviewer
   feedback:", "Test results:"...); lines of the problem statement, fenced code and labelled
   candidates (``A:``, ``B:`` ... or ``(A)``) are recognised by structure.
2. What is left (the preamble, headers and reply-format sections) is the *instruction*. What
   it asks of the model (reasoning asked or forbidden, brevity and its scope, whether the
   problem is to be solved at all) is read compositionally by :mod:`.directives`; keyword
   families decide the request kind ("critically review" / "check whether ... is correct").
3. Kinds, first match wins: ``choose`` (labelled candidates and a choice verb), ``program_fix``
   and ``program`` (a ``solve()`` program), ``test_fix`` (code plus failures and a fix verb),
   ``revise`` (feedback shown and a revise verb), ``review`` (a verdict asked for),
   ``format`` (extract the final answer from a shown solution), ``code`` (a code problem),
   else ``answer``.

Called by :class:`aflowrl.executor.surrogate.model.SurrogateModel` for every request.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from aflowrl.executor.surrogate.directives import Discard, read_directives
from aflowrl.executor.surrogate.index import IndexMatch, ProblemIndex

Kind = Literal[
    "answer",
    "code",
    "program",
    "program_fix",
    "choose",
    "review",
    "revise",
    "test_fix",
    "format",
]

Role = Literal["solution", "feedback", "errors", "hint", "problem", "instruction"]


def _family(*alternatives: str) -> re.Pattern[str]:
    """One pattern for a keyword family, matched on lower-cased text (one alternation is far
    faster than many patterns or a case-insensitive one)."""
    return re.compile(r"\b(?:" + "|".join(alternatives) + ")")


_CHOOSE = _family(
    r"choose\b",
    r"chose\b",
    r"select\b",
    r"pick\b",
    r"vote\b",
    r"which (?:one|candidate|solution|option|answer)\b",
    r"letter\b",
    r"best candidate\b",
    r"consensus\b",
    r"majority\b",
    r"self-consistency\b",
    r"most (?:consistent|likely|common|frequent)(?:ly)?\b",
    r"consisten(?:t|cy)\b",
)
_JUDGE = _family(
    r"critical(?:ly)?\b",
    r"judg(?:e|es|ing)\b",
    r"examin(?:e|ing)\b",
    r"scrutini[sz]e\b",
    r"evaluate each\b",
    r"errors? in\b",
)
_CONSISTENCY = _family(
    r"agree(?:s|ment)?\b", r"consisten(?:t|cy)\b", r"majority\b", r"most (?:common|frequent)\b"
)
_REVIEW = _family(
    r"review\b",
    r"critique\b",
    r"critically\b",
    r"verify\b",
    r"check (?:whether|if|that|every|each|the)\b",
    r"assess\b",
    r"grade\b",
    r"decide whether\b",
)
_VERDICT = _family(
    r"(?:correct|incorrect|right|wrong|valid|invalid|true|false|mistakes?|errors?)\b"
)
_REVISE = _family(
    r"revis(?:e|ed|ion)\b",
    r"rewrite\b",
    r"improve\b",
    r"refine\b",
    r"fix\b",
    r"correct (?:it|the|your)\b",
)
_FIX = _family(
    r"(?:fix|fixed|correct|corrected|debug|repair|bug)\b",
    r"better (?:code |python )?(?:solution|code|version)\b",
)
_FAILURE = _family(r"fail(?:s|ed|ing|ure|ures)?\b", r"error\b", r"traceback\b", r"assert")
_FORMAT = _family(
    r"extract\b",
    r"restate\b",
    r"reformat\b",
    r"format the (?:final )?answer\b",
    r"final answer only\b",
)
_PROGRAM = _family(
    r"solve\(\)",
    r"python (?:program|script)\b",
    r"write (?:a |the )?(?:python )?(?:program|code) (?:that|to|which) "
    r"(?:comput|calculat|solv|find)",
    r"(?:function|method) (?:named |called )?['\"`]?solve\b",
)
_TAG = re.compile(r"<([a-z_]+)>", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed")
_FENCE = re.compile(r"```[^\n]*\n.*?(?:```|\Z)", re.DOTALL)
_MARKDOWN_HEADING = re.compile(r"^#{2,6}\s*([A-Za-z][A-Za-z0-9 '’/_-]{0,60}?)\s*:?\s*$")
_LOOKS_LIKE_CODE = re.compile(r"^\s*(?:def|class|import|from)\s", re.MULTILINE)
_LABEL = re.compile(r"^\s*\(?([A-Z])[:.)]\s*(.*)$")
_HEADER = re.compile(r"^(?:[#*]+\s*)?([A-Za-z][A-Za-z0-9 '’/_-]{0,60}?)\s*[*]*:\s*[*]*\s*$")
_BACKTICK_NAME = re.compile(r"`([A-Za-z_]\w*)(?:\(\))?`")


def _words(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(patterns), re.IGNORECASE)


_ROLE_RULES: tuple[tuple[Role, re.Pattern[str]], ...] = (
    ("feedback", _words(r"feedback", r"critique", r"review(er)?'?s?\b", r"comments?", r"suggest")),
    (
        "errors",
        _words(r"\btests?\b", r"error", r"traceback", r"failure", r"exception", r"execution"),
    ),
    ("hint", _words(r"earlier", r"analysis", r"previous step", r"prior step", r"hint", r"notes?")),
    (
        "solution",
        _words(
            r"solution",
            r"answer",
            r"\bcode\b",
            r"program",
            r"response",
            r"attempt",
            r"draft",
            r"propos",
            r"current",
            r"previous",
            r"reasoning",
        ),
    ),
    ("problem", _words(r"problem", r"question", r"task", r"context", r"passage")),
)


@dataclass(frozen=True)
class Section:
    """A header and the lines under it."""

    header: str
    role: Role
    body: str
    lines: tuple[int, ...]
    """Line numbers of the body (the header line itself counts as instruction)."""
    at: int = -1
    """Line number of the header."""


@dataclass(frozen=True)
class Reading:
    """What a prompt asks for."""

    kind: Kind
    match: IndexMatch | None
    """The problem the prompt is about (None: no known problem)."""
    instruction: str
    """The prompt's instructions (without the problem and the material shown)."""
    step_by_step: bool = False
    """Asks for reasoning (and does not forbid it)."""
    concise: bool = False
    """Asks for a short final answer (or a short reply)."""
    answer_only: bool = False
    """Asks for the bare answer and no reasoning (forbidden, or a brief reply with none
    asked; asked and forbidden at once, the prohibition wins)."""
    verbose: bool = False
    """Asks for a detailed, justified answer."""
    discard: Discard | None = None
    """The instruction tells the model not to address the problem, and how it replies instead
    (:class:`~aflowrl.executor.surrogate.directives.Directives`)."""
    literal: str | None = None
    """The constant the instruction names as the reply, if any."""
    contradicted: bool = False
    """Reasoning is both asked for and forbidden."""
    judge: bool = False
    """``choose``: judge the candidates critically (else: find the one most agree with)."""
    tags: frozenset[str] = frozenset()
    """XML-like tags the reply should use (``answer``, ``thought``, ``solution_letter``...)."""
    boxed: bool = False
    candidates: tuple[str, ...] = ()
    """``choose``: the labelled candidates, in order."""
    solution: str | None = None
    """The solution shown for review, revision, extraction or fixing."""
    feedback: str | None = None
    errors: str | None = None
    """Test failures or the error of a failed program."""
    shown: tuple[str, ...] = ()
    """Earlier results shown to a generating prompt (notes, candidate pools)."""
    entry_point: str | None = None
    """The function a code reply must define (from the problem, else from the prompt)."""
    sections: tuple[Section, ...] = field(default=(), repr=False)


def read_request(contents: Sequence[str], index: ProblemIndex) -> Reading:
    """Read chat message contents (system and user turns, in order)."""
    text = "\n\n".join(contents)
    match = index.match(text)
    without_code, fences = _strip_fences(text)
    lines = without_code.splitlines()
    region = _problem_region(lines, match)
    candidates, candidate_lines = _candidates(lines, region)
    sections = _sections(lines, region | candidate_lines)
    material: set[int] = set()
    material_roles = _MATERIAL if match is not None else _MATERIAL | {"problem"}
    for section in sections:
        if section.role in material_roles:
            material.update(section.lines)
    instruction = "\n".join(
        line
        for number, line in enumerate(lines)
        if number not in region
        and number not in candidate_lines
        and number not in material
        and not line.startswith(_PLACEHOLDER)
    )
    low = instruction.lower()
    tags = frozenset(t.lower() for t in _TAG.findall(low))
    entry_point = _entry_point(match, instruction)

    def body(role: Role) -> str | None:
        # An empty section still shows something (an empty solution to extract from), unless
        # it ends the prompt: then it is the slot for the reply ("...\n\nAnswer:").
        found = [
            s.body
            for s in sections
            if s.role == role and (s.body or any(line.strip() for line in lines[s.at + 1 :]))
        ]
        return _restore(found[0], fences) if found else None

    # A header that labels material ("Test results:", "Analysis to build on:") names what is
    # shown; it asks for nothing, so it is not read for what the prompt asks.
    labels = {section.at for section in sections if section.role != "instruction"}
    directives = read_directives(
        "\n".join(
            line
            for number, line in enumerate(lines)
            if number not in region
            and number not in candidate_lines
            and number not in material
            and number not in labels
            and not line.startswith(_PLACEHOLDER)
        )
    )
    solution = body("solution")
    feedback = body("feedback")
    errors = body("errors")
    hints = tuple(_restore(s.body, fences) for s in sections if s.role == "hint" and s.body)
    shown_candidates = tuple(_restore(c, fences) for c in candidates)
    base = Reading(
        "answer",
        match,
        instruction,
        step_by_step=directives.step_by_step,
        concise=directives.concise,
        answer_only=directives.answer_only,
        verbose=directives.verbose,
        discard=directives.discard,
        literal=directives.literal,
        contradicted=directives.contradicted,
        tags=tags,
        boxed=bool(_BOXED.search(low)),
        entry_point=entry_point,
        sections=tuple(sections),
    )
    is_code_problem = match is not None and match.problem.entry_point is not None
    generating = replace(
        base,
        kind="code" if is_code_problem or (entry_point and "function" in low) else "answer",
        shown=hints + shown_candidates,
    )
    if len(candidates) >= 2 and ("solution_letter" in tags or _CHOOSE.search(low)):
        judge = len(_JUDGE.findall(low)) > len(_CONSISTENCY.findall(low))
        return replace(base, kind="choose", candidates=shown_candidates, judge=judge)
    wants_program = not is_code_problem and ("solve()" in low or bool(_PROGRAM.search(low)))
    if solution is None and not fences:
        return replace(generating, kind="program") if wants_program else generating
    asks_fix = bool(_FIX.search(low))
    failed = errors is not None or bool(_FAILURE.search(low))
    if wants_program:
        if failed and asks_fix and solution is not None:
            return replace(base, kind="program_fix", solution=solution, errors=errors)
        return replace(generating, kind="program")
    code_shown = bool(fences) or bool(solution and _LOOKS_LIKE_CODE.search(solution))
    if code_shown and asks_fix and failed and (feedback is None or errors is not None):
        code = solution if solution is not None else "\n".join(fences)
        return replace(base, kind="test_fix", solution=code, errors=errors)
    if feedback is not None and solution is not None and _REVISE.search(low):
        return replace(base, kind="revise", solution=solution, feedback=feedback)
    verdict_asked = "review_result" in tags or (_REVIEW.search(low) and _VERDICT.search(low))
    if solution is not None and verdict_asked:
        return replace(base, kind="review", solution=solution)
    if solution is not None and _FORMAT.search(low):
        return replace(base, kind="format", solution=solution)
    return generating


_MATERIAL: frozenset[Role] = frozenset({"solution", "feedback", "errors", "hint"})
_IMPERATIVE = re.compile(
    r"^(?:reply|respond|return|give|write|rewrite|define|answer|output|provide|please|use|"
    r"make|now|then|put|format|only|do not|don't|your|keep|think|explain|be|fix|choose|"
    r"select|revise|improve|refine|correct|extract|verify|check|review|decide|compare|"
    r"identify|read|find|solve|compute|calculate|state|list|pick|vote|judge|carefully|"
    r"analy[sz]e|evaluate|consider|determine|assess)\b",
    re.IGNORECASE,
)
_REPLY_TAG = re.compile(r"<[a-z_]+>")
_ABOUT_CANDIDATES = re.compile(
    r"\b(?:these|the above|above|each|all|the) (?:solutions?|candidates?|answers?|options?)\b",
    re.IGNORECASE,
)
_LABEL_START = frozenset("(ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_PLACEHOLDER = "\x00code"
_PLACEHOLDER_REF = re.compile(r"\x00code(\d+)\x00")
_PY_KEYWORDS = frozenset(
    {"else", "try", "finally", "except", "do", "elif", "lambda", "match", "class", "case", "with"}
)


def _strip_fences(text: str) -> tuple[str, list[str]]:
    """``text`` with fenced code replaced by a placeholder line, and the fenced blocks."""
    fences: list[str] = []

    def keep(found: re.Match[str]) -> str:
        fences.append(found.group(0))
        return f"\n{_PLACEHOLDER}{len(fences) - 1}\x00\n"

    return _FENCE.sub(keep, text), fences


def _restore(text: str, fences: list[str]) -> str:
    """Put fenced code back in place of its placeholders."""
    if _PLACEHOLDER not in text:
        return text
    return _PLACEHOLDER_REF.sub(lambda found: fences[int(found.group(1))], text).strip()


def _problem_region(lines: list[str], match: IndexMatch | None) -> set[int]:
    """Line numbers of the first copy of the problem statement in the prompt."""
    if match is None:
        return set()
    own = question_lines(match.problem.question)
    first = next((n for n, line in enumerate(lines) if line.strip() in match.lines), None)
    if first is None:
        return set()
    last = first
    for number in range(first + 1, len(lines)):
        stripped = lines[number].strip()
        if stripped and stripped not in own:
            break
        if stripped:
            last = number
    return set(range(first, last + 1))


_QUESTION_LINES: dict[str, frozenset[str]] = {}


def question_lines(question: str) -> frozenset[str]:
    """The stripped, non-blank lines of a problem statement (remembered per statement)."""
    found = _QUESTION_LINES.get(question)
    if found is None:
        found = frozenset(line.strip() for line in question.splitlines() if line.strip())
        if len(_QUESTION_LINES) > 20_000:
            _QUESTION_LINES.clear()
        _QUESTION_LINES[question] = found
    return found


def _is_header(line: str) -> str | None:
    if line.startswith("##"):  # a markdown heading (one "#" is a Python comment)
        heading = _MARKDOWN_HEADING.match(line)
        return heading.group(1).strip() if heading else None
    tail = line.rstrip()[-3:]
    if ":" not in tail or len(line) > 80:
        return None
    found = _HEADER.match(line)
    if found is None:
        return None
    name = found.group(1).strip()
    if len(name) < 2 or name.split()[0].lower() in _PY_KEYWORDS:
        return None
    return name


def _candidates(lines: list[str], region: set[int]) -> tuple[tuple[str, ...], set[int]]:
    """Labelled candidates (``A:``, ``(A)``, ``A.`` at line starts, consecutive letters from
    A) outside the problem statement, and the line numbers they occupy."""
    starts: list[tuple[int, str]] = []
    expected = "A"
    for number, line in enumerate(lines):
        if number in region or not line or line.lstrip()[:1] not in _LABEL_START:
            continue
        found = _LABEL.match(line)
        if found is None or found.group(1) != expected:
            continue
        starts.append((number, found.group(2)))
        expected = chr(ord(expected) + 1)
    if len(starts) < 2:
        return (), set()
    texts: list[str] = []
    used: set[int] = set()
    for i, (number, first) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else _block_end(lines, number + 1)
        used.update(range(number, end))
        texts.append("\n".join([first, *lines[number + 1 : end]]).strip())
    return tuple(texts), used


def _block_end(lines: list[str], start: int) -> int:
    """Where the last candidate ends: before the run of paragraphs at the end of the prompt
    that read as instructions (a header, an imperative, a question, reply tags, words about
    "these solutions"). Scanning from the end, a candidate's own paragraphs are never cut."""
    end = len(lines)
    position = len(lines)
    while position > start:
        while position > start and not lines[position - 1].strip():
            position -= 1
        first = position
        while first > start and lines[first - 1].strip():
            first -= 1
        if first <= start or not _instruction_like(lines[first]):
            break
        end = position = first
    return end


def _instruction_like(line: str) -> bool:
    if _is_header(line):
        return True
    if not line[:1].isalpha():
        return False
    return bool(
        _IMPERATIVE.match(line)
        or "?" in line
        or _REPLY_TAG.search(line)
        or _ABOUT_CANDIDATES.search(line)
    )


def _role(header: str) -> Role:
    for role, pattern in _ROLE_RULES:
        if pattern.search(header):
            return role
    return "instruction"


def _sections(lines: list[str], skip: set[int]) -> list[Section]:
    """Header-delimited sections; lines in ``skip`` (problem statement, candidates) are neither
    headers nor section text. A header starts a line, ends with a colon and follows a blank
    line or code (or, when it names material such as "Error:", a finished sentence), so lines
    of code shown in a section never cut it."""
    sections: list[Section] = []
    header: str | None = None
    at = -1
    body: list[int] = []

    def close() -> None:
        if header is None:
            return
        role = _role(header)
        kept = body
        if role in _MATERIAL:
            kept = _without_trailing_instructions(
                lines, body, by_line=role in ("errors", "feedback")
            )
        text = "\n".join(lines[n] for n in kept).strip()
        sections.append(Section(header, role, text, tuple(kept), at))

    for number, line in enumerate(lines):
        if number in skip:
            continue
        name = _is_header(line)
        if name is not None and number > 0 and not line.startswith("##"):
            before = lines[number - 1].rstrip()
            after_break = not before or before.startswith(_PLACEHOLDER)
            after_sentence = before.endswith((".", "!", "?")) and _role(name) != "instruction"
            if not (after_break or after_sentence):
                name = None
        if name is not None:
            close()
            header, at, body = name, number, []
        elif header is not None:
            body.append(number)
    close()
    return sections


def _without_trailing_instructions(
    lines: list[str], body: list[int], *, by_line: bool = False
) -> list[int]:
    """``body`` without its last paragraphs when they read as instructions ("Reply with...",
    "Define a function..."): material shown in a prompt is often followed by what to do.
    With ``by_line`` (test failures, feedback: short material) a last line does too."""
    end = len(body)
    while by_line and end > 1 and _IMPERATIVE.match(lines[body[end - 1]]):
        end -= 1
    while end > 0:
        start = end
        while start > 0 and lines[body[start - 1]].strip():
            start -= 1
        first = lines[body[start]].strip() if start < end else ""
        if start == 0 or not first or not _IMPERATIVE.match(first):
            break
        end = start
        while end > 0 and not lines[body[end - 1]].strip():
            end -= 1
    return body[:end]


def _entry_point(match: IndexMatch | None, instruction: str) -> str | None:
    if match is not None and match.problem.entry_point:
        return match.problem.entry_point
    names = [
        n
        for n in _BACKTICK_NAME.findall(instruction)
        if n not in ("solve", "candidate") and not keyword.iskeyword(n)
    ]
    return names[0] if names else None
