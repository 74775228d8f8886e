"""What an instruction asks of the model: reasoning, brevity, and whether to solve the problem.

:func:`read_directives` reads the instruction part of a prompt (the reading module has already
taken out the problem statement and any material shown) compositionally, the way a model
would, rather than by spotting keywords:

1. **Normalise**: lower case, contractions expanded ("don't" -> "not"), quoted strings, inline
   code and reply tags set aside (a tag's content is read with the tag as its scope: what
   ``<answer>...</answer>`` says applies to the answer), multi-word expressions made one
   token (:mod:`._lexicon`).
2. **Segment** into sentences, then clauses at sequencers ("then", "once done"), contrasts
   ("but"), subordinators ("before", "until", "if") and coordinated verbs ("..., and state"),
   keeping a list of verbs under one negation together ("do not think, reason or explain").
3. **Polarity**: every word carries the parity of the negations in force before it in its
   clause (negators "not", "never", "no", "without"; verbs that negate their object "skip",
   "avoid", "refrain from", "ignore"; postposed "X is unnecessary"), so "no reply without a
   derivation" asks for a derivation and "never omit a step" asks for steps.
4. **Frames**: verbs in verb position (imperative, infinitive, after a negator or
   preposition) with the noun phrase they take and its head, read through word families:
   reasoning, production of text, engagement with the problem, disregard, echo, other work.
5. **Decide**, for the whole instruction:

   * *reasoning* asked (a reasoning verb or a produced reasoning noun, positive), or
     forbidden (the same negated, the reply restricted to the answer, thinking kept
     silent, an immediate answer). A prohibition about the *answer* ("then state the answer
     with no elaboration", "the last line holds only the answer", inside ``<answer>``) is
     scope, not a prohibition of reasoning. Asked and forbidden at once (outside such scope)
     is a contradiction, and the prohibition is followed;
   * *brevity* of the answer ("state the result briefly") or of the whole reply ("be
     concise");
   * *discarding the problem*: the problem disregarded or not to be engaged with ("ignore
     the question", "do not answer", "skip it"), an answer made up or
     random, a constant named as the answer (``return None``, "always 0", "the word X"), an
     empty reply, the problem echoed back, or some other work done instead ("write a poem",
     "answer a different question"). Conditions ("return 0 if the list is empty"), format
     examples ("e.g. 42"), alternatives ("yes or no") and demands for more than the answer
     ("do not just answer", "do not answer until you have checked") are not discards.

What it cannot read: sarcasm, instructions that rely on world knowledge to tell a relevant
detail from an irrelevant one, and languages other than English (see the README). Deterministic
and cached per instruction text. Called by :mod:`.reading`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Final, Literal

from aflowrl.executor.surrogate import _lexicon as lex
from aflowrl.executor.surrogate._clauses import (
    ANSWER_TAGS,
    NP_STOP,
    NUMBER,
    PLACEHOLDER,
    REASON_TAGS,
    TEMPLATE_WORDS,
    Clause,
    Spans,
    Word,
    cut_clauses,
    normalise,
    object_phrase,
    phrase_head,
)

Reasoning = Literal["asked", "forbidden", "unspecified"]
Discard = Literal["neglect", "random", "constant", "empty", "echo", "other"]
"""How a reply that discards the problem is made: ``neglect`` (turns away from it), ``random``
(a made-up answer), ``constant`` (a named constant), ``empty``, ``echo`` (the problem given
back), ``other`` (some other work)."""


@dataclass(frozen=True)
class Directives:
    """What an instruction asks for."""

    reasoning: Reasoning = "unspecified"
    contradicted: bool = False
    """Reasoning both asked for and forbidden (outside an answer's scope): the prohibition is
    followed."""
    answer_brief: bool = False
    """The final answer is to be short ("state the result briefly", ``<answer>``)."""
    reply_brief: bool = False
    """The whole reply is to be short ("be concise")."""
    verbose: bool = False
    """A detailed, elaborate reply is asked for."""
    discard: Discard | None = None
    """The reply does not address the problem, and how (None: it does)."""
    literal: str | None = None
    """The constant to give, when the instruction names one."""

    @property
    def step_by_step(self) -> bool:
        return self.reasoning == "asked"

    @property
    def answer_only(self) -> bool:
        """No reasoning in the reply: forbidden, or a brief reply with none asked for."""
        return self.reasoning == "forbidden" or (
            self.reasoning == "unspecified" and self.reply_brief
        )

    @property
    def concise(self) -> bool:
        return self.answer_brief or self.reply_brief or self.reasoning == "forbidden"


# --- 4 and 5. reading the clauses ---------------------------------------------------------------

_FREE_MODIFIERS: Final = lex.words(
    """
    original entire whole full actual real main stated above below given provided following
    current same
    """
)
_REASON_MODIFIERS: Final = lex.words(
    """
    any all more much long lengthy extra additional further unnecessary detailed visible written
    explicit intermediate your own each every the a an of no its their my our full complete
    clear careful brief short concise stepwise whole entire step
    """
)


_SIZES: Final = lex.words(
    """
    lengthy long longer verbose unnecessary excessive extensive detailed extra superfluous
    rambling redundant overly wordy
    """
)
"""Modifiers that make a negated reasoning noun a limit on its length, not a prohibition."""


@dataclass
class _Findings:
    reason_asked: bool = False
    hard_forbidden: bool = False
    soft_forbidden: bool = False
    restrict_hard: bool = False
    restrict_soft: bool = False
    immediate: bool = False
    hidden: bool = False
    answer_brief: bool = False
    reply_brief: bool = False
    verbose: bool = False
    engaged: bool = False
    neglect: bool = False
    random: bool = False
    constant: bool = False
    empty: bool = False
    echo: bool = False
    echo_restricted: bool = False
    other: bool = False
    other_instead: bool = False
    literal: str | None = None
    constancy: bool = False
    """A clause so far said "always", "every time"... (a constant named later is the reply)."""


@functools.lru_cache(maxsize=4096)
def read_directives(instruction: str) -> Directives:
    """What ``instruction`` asks for (cached: the same instruction recurs across problems)."""
    spans = Spans()
    segments = normalise(instruction[:20_000], spans)
    read = _read_normalised(tuple(segments), frozenset(spans.tags))
    placeholder = PLACEHOLDER.match(read.literal or "")
    if placeholder is None:
        return read
    held = spans.code if placeholder.group(1) == "c" else spans.quoted
    return dataclasses.replace(read, literal=held[int(placeholder.group(2))])


@functools.lru_cache(maxsize=4096)
def _read_normalised(segments: tuple[tuple[str, str], ...], tags: frozenset[str]) -> Directives:
    """The reading of a normalised instruction (a literal it names may be a placeholder)."""
    clauses = [clause for text, scope in segments for clause in cut_clauses(text, scope)]
    found = _Findings()
    if tags & REASON_TAGS:
        found.reason_asked = True
    if tags & ANSWER_TAGS:
        found.answer_brief = True
        found.restrict_soft = True  # the reply's form is the answer tag
    for number, clause in enumerate(clauses):
        following = clauses[number + 1] if number + 1 < len(clauses) else None
        _read_clause(clause, following, found)
    return _decide(found)


def _decide(found: _Findings) -> Directives:
    prohibited = found.hard_forbidden or found.restrict_hard or found.hidden
    contradicted = found.reason_asked and prohibited
    reasoning: Reasoning
    if found.reason_asked and not prohibited:
        reasoning = "asked"
    elif prohibited or found.soft_forbidden or found.restrict_soft or found.immediate:
        reasoning = "forbidden"
    else:
        reasoning = "unspecified"
    engaged = found.engaged or found.reason_asked
    discard: Discard | None = None
    if found.constant or found.literal is not None:
        discard = "constant"
    elif found.empty:
        discard = "empty"
    elif found.random:
        discard = "random"
    elif found.other and (found.other_instead or found.neglect or not engaged):
        discard = "other"
    elif found.echo and (found.echo_restricted or found.neglect or not engaged):
        discard = "echo"
    elif found.neglect:
        discard = "neglect"
    return Directives(
        reasoning=reasoning,
        contradicted=contradicted,
        answer_brief=found.answer_brief or found.restrict_soft or found.restrict_hard,
        reply_brief=found.reply_brief or found.restrict_hard,
        verbose=found.verbose,
        discard=discard,
        literal=found.literal,
    )


def _read_clause(clause: Clause, following: Clause | None, found: _Findings) -> None:
    words = clause.words
    texts = [w.text for w in words]
    answer_scoped = (
        clause.scope == "answer"
        or clause.link == "then"
        or any(t in lex.ANSWER_LOCATIONS for t in texts)
    )
    # the answer named in any role ("answer immediately" speaks of it too)
    has_answer_noun = any(w.lemma in lex.ANSWER_NOUNS for w in words)
    hidden = any(t in lex.HIDDEN for t in texts)
    reasoning_here = False
    for position, word in enumerate(words):
        if _reasoning_concept(words, position):
            reasoning_here = reasoning_here or not word.negated
            if word.negated:
                if position and words[position - 1].text in _SIZES:
                    found.reply_brief = True  # "avoid lengthy explanations": short, not none
                elif answer_scoped or has_answer_noun:
                    found.soft_forbidden = True
                else:
                    found.hard_forbidden = True
            elif hidden:
                found.hidden = True
            elif clause.scope != "answer":
                found.reason_asked = True
        if word.text in lex.VERBOSE and not word.negated:
            found.verbose = True
        if word.text in lex.IMMEDIATE and not word.negated and not reasoning_here:
            found.immediate = found.immediate or _answering(words)
    _read_brevity(clause, answer_scoped, has_answer_noun, reasoning_here, found)
    _read_restriction(clause, answer_scoped, found)
    _read_engagement(clause, following, found)
    _read_replacement(clause, following, found)
    _read_literals(clause, found)
    _read_literal_after(clause, following, found)
    if not clause.conditional and any(w.text in _CONSTANCY and not w.negated for w in words):
        found.constancy = True


def _reasoning_concept(words: list[Word], position: int) -> bool:
    """Whether the word at ``position`` asks for (or, negated, forbids) reasoning."""
    word = words[position]
    if word.verb and word.lemma in lex.REASON_VERBS:
        return True
    if word.verb and word.lemma in lex.PRODUCE_VERBS:
        phrase = object_phrase(words, position)
        end = position + 1 + len(phrase)
        after = words[end] if end < len(words) else None
        return (
            after is not None
            and after.text in ("how", "why")
            and all(w.text in ("me", "us", "them", "clearly", "exactly") for w in phrase)
        )
    if _reason_noun(word) and not word.verb:
        if word.text in lex.REASON_NOUNS_PLAIN or word.lemma in lex.REASON_NOUNS_PLAIN:
            return True
        previous = words[position - 1] if position > 0 else None
        return (
            previous is None
            or previous.verb
            or previous.text in _REASON_MODIFIERS
            or previous.text in lex.NEGATORS
            or previous.text in NP_STOP
            or _reason_noun(previous)
            or previous.text in lex.BREVITY
            or previous.text in lex.VERBOSE
        )
    return False


def _reason_noun(word: Word) -> bool:
    text = word.text
    if text in lex.REASON_NOUNS or (text.endswith("s") and text[:-1] in lex.REASON_NOUNS):
        return True
    # by its lemma only in a noun form ("calculations"), not a verb's ("worked", "planning")
    return word.lemma in lex.REASON_NOUNS and not text.endswith(("ed", "ing"))


def _answering(words: list[Word]) -> bool:
    return any(
        w.verb and (w.lemma in lex.REPLY_VERBS or w.lemma in lex.PRODUCE_VERBS) for w in words
    )


def _read_brevity(
    clause: Clause,
    answer_scoped: bool,
    has_answer_noun: bool,
    reasoning_here: bool,
    found: _Findings,
) -> None:
    brief = [w for w in clause.words if w.text in lex.BREVITY and not w.negated]
    if not brief or reasoning_here:
        return  # brief reasoning is still reasoning
    answer_nouns = [w for w in clause.words if w.lemma in lex.ANSWER_NOUNS and not w.verb]
    if answer_scoped or answer_nouns or (has_answer_noun and not _replying(clause)):
        found.answer_brief = True
    else:
        found.reply_brief = True


def _replying(clause: Clause) -> bool:
    return any(w.verb and w.lemma in lex.REPLY_VERBS for w in clause.words)


def _read_restriction(clause: Clause, answer_scoped: bool, found: _Findings) -> None:
    """ "only the answer", "nothing else", "the answer alone": the reply restricted to the
    answer (reply-level), or the answer part kept bare (scope)."""
    words = clause.words
    if clause.conditional:
        return
    for position, word in enumerate(words):
        if word.text not in lex.RESTRICTORS or word.negated:
            continue
        if word.text == "nothing_else":
            target_is_answer = True
        else:
            window = words[max(0, position - 3) : position + 5]
            target_is_answer = any(
                (w.lemma in lex.ANSWER_NOUNS and not w.verb) or w.text in ("tag_answer",)
                for w in window
            ) or (
                position > 0
                and words[position - 1].verb
                and words[position - 1].lemma in lex.REPLY_VERBS
                and (position + 1 == len(words) or words[position + 1].text == ",")
            )
            if not target_is_answer:
                continue
        reply_level = _replying(clause) or any(
            w.lemma in ("reply", "response", "output") and not w.verb for w in words
        )
        if answer_scoped:
            found.restrict_soft = True
        elif reply_level or word.text == "nothing_else":
            found.restrict_hard = True
        else:
            found.restrict_soft = True
        return


def _problem_object(phrase: list[Word]) -> tuple[bool, bool]:
    """(names the problem, names some other problem) for a verb's object."""
    head, modifiers = phrase_head(phrase)
    if head is None:
        return False, False
    texts = {w.text for w in modifiers}
    other = bool(texts & lex.OTHER_ADJECTIVES)
    if head.lemma in lex.PROBLEM_NOUNS:
        determined = bool(texts & lex.DETERMINERS) or head.lemma in ("question", "problem", "task")
        free = all(
            w.text in lex.DETERMINERS
            or w.lemma in lex.PROBLEM_NOUNS
            or w.text in _FREE_MODIFIERS
            or w.text in lex.OTHER_ADJECTIVES
            for w in modifiers
        )
        return determined and free and not other, other and free
    if head.text in lex.PROBLEM_PRONOUNS and not modifiers:
        return True, False
    if head.text == "one" and other:
        return False, True
    return False, False


def _read_engagement(clause: Clause, following: Clause | None, found: _Findings) -> None:
    words = clause.words
    texts = [w.text for w in words]
    temporal = following is not None and following.sub in ("until", "till", "before", "unless")
    for position, word in enumerate(words):
        if not word.verb:
            continue
        phrase = object_phrase(words, position)
        is_problem, is_other = _problem_object(phrase)
        head, _ = phrase_head(phrase)
        rest = words[position + 1 + len(phrase) :]
        if word.lemma in ("refuse", "decline") and not word.negated:
            trailing = [w for w in rest if w.text not in lex.FILLERS and not w.text.endswith("ly")]
            adverbs_only = all(w.text in lex.FILLERS or w.text.endswith("ly") for w in phrase)
            if (is_problem or adverbs_only) and not trailing and not clause.conditional:
                found.neglect = True  # "refuse politely"
        if word.lemma in lex.DISREGARD_VERBS and not word.negated and is_problem:
            if not clause.conditional and not set(texts) & {"initially", "temporarily"}:
                found.neglect = True
        elif word.lemma in lex.ENGAGE_VERBS and word.negated:
            refusal = is_problem or (
                not phrase and word.lemma in ("answer", "solve", "attempt", "address", "reply")
            )
            trailing = [w for w in rest if w.text not in lex.FILLERS and w.text != ","]
            # "without reading the problem": its own "without" does not block it
            own = position - 1 if position and words[position - 1].text in lex.COMMA_SCOPED else -1
            blockers = {w.text for i, w in enumerate(words) if i != own} & lex.TEMPORAL_BLOCKERS
            blocked = bool(blockers) or bool(trailing) or temporal or clause.conditional
            if refusal and not blocked:
                found.neglect = True
        elif word.lemma in lex.ENGAGE_VERBS:
            offered = _with_object(rest)
            if offered & (lex.OTHER_NOUNS | {"trivia"}):
                found.other = True  # "answer with a limerick": some other work, not the answer
            elif is_other:
                found.other = True
                found.other_instead = found.other_instead or clause.instead
            elif is_problem or not phrase or (head is not None and head.lemma in lex.ANSWER_NOUNS):
                found.engaged = True
        if word.negated:
            continue
        gives_back = word.lemma in lex.ECHO_VERBS or (
            word.lemma in lex.PRODUCE_VERBS and word.lemma not in ("answer", "reply", "respond")
        )
        if gives_back and is_problem and head is not None and head.text not in lex.PROBLEM_PRONOUNS:
            found.echo = True
            found.echo_restricted = found.echo_restricted or bool(
                set(texts) & {"just", "only", "verbatim", "nothing_else", "merely", "simply"}
            )
        elif word.lemma in lex.OTHER_VERBS:
            found.other = True
            found.other_instead = found.other_instead or clause.instead
        elif word.lemma in lex.REASON_VERBS:
            found.engaged = True
        elif word.lemma in lex.ENGAGE_VERBS and clause.instead and phrase and not is_problem:
            found.other = found.other_instead = True  # "solve 2 + 2 instead"
        elif word.lemma in lex.PRODUCE_VERBS or word.lemma in lex.REPLY_VERBS:
            nouns = {w.lemma for w in phrase}
            if nouns & lex.OTHER_NOUNS:
                found.other = True
                found.other_instead = found.other_instead or clause.instead
            elif head is not None and head.lemma in lex.ANSWER_NOUNS:
                found.engaged = True
            elif clause.instead and phrase and not nouns & lex.REASON_NOUNS:
                found.other = found.other_instead = True
    producing = any(
        not w.negated and (w.text in lex.COPULAS or (w.verb and w.lemma in lex.PRODUCE_VERBS))
        for w in words
    )
    if _part_of_problem(words):
        found.echo = found.echo_restricted = True  # "answer with the last word of the task"
    for position, word in enumerate(words):
        if word.negated:
            continue
        if (word.lemma in lex.OTHER_NOUNS or word.text == "trivia") and producing:
            found.other = True
            found.other_instead = found.other_instead or clause.instead
        if word.lemma in lex.INVENT_VERBS and word.verb:
            if word.lemma == "guess" and not _random_here(words):
                found.immediate = True
            else:
                found.random = True
        if word.text in lex.RANDOM and not clause.conditional and _random_answer(words, position):
            found.random = True


_REPLACE_VERBS: Final = lex.words("replace swap substitute exchange switch trade")
"""Verbs that put something in the problem's place when the problem is their object."""
_PICK_VERBS: Final = lex.words(
    "pick choose select invent make create pose take find devise write set come"
)
"""Verbs that bring in another problem when their object is one ("pick another task")."""
_SELF_CHOSEN: Final = lex.words("own choosing choice liking preference")
"""Words that make a problem the replier's own ("a question of your own choosing")."""
_QUESTION_WORDS: Final = lex.words("what who whom whose which where when why how")
_TASK_NOUNS: Final = lex.words("question task job problem query assignment goal mission")
_WANTING: Final = lex.words("like want wish prefer choose pick fancy")
"""After "you": a problem the replier picks ("any question you like")."""
_AUXILIARIES: Final = lex.words("be do have can could will would should shall may might must")
_CONSTANCY: Final = lex.words(
    "always constant constantly every each whatever whichever regardless irrespective same "
    "identical"
)
"""Words that make a named value the reply whatever the problem ("always", "every time")."""


def _read_replacement(clause: Clause, following: Clause | None, found: _Findings) -> None:
    """Another question answered in the problem's place: the problem replaced ("rather than
    this problem, ...", "replace the question with ..."), another problem brought in ("pick
    some other problem", "a question of your own choosing"), or a question of the
    instruction's own asked instead ("instead: what year did ...?")."""
    asked_next = following is not None and _interrogative(following)
    if clause.conditional and not (asked_next and following is not None and following.sub):
        return  # (a question's own "when"/"where" marks its sentence conditional)
    words = clause.words
    for position, word in enumerate(words):
        phrase = object_phrase(words, position)
        if word.text == "instead_of":
            if _the_problem(phrase):
                found.other = found.other_instead = True
            continue
        imperative = position == 0 and word.lemma in _REPLACE_VERBS  # "swap the problem..."
        if not (word.verb or imperative) or word.negated:
            continue
        is_problem, is_other = _problem_object(phrase)
        replaced = (word.lemma in _REPLACE_VERBS and is_problem) or (
            word.lemma in _PICK_VERBS and is_other
        )
        if not replaced and word.lemma in lex.ENGAGE_VERBS | _PICK_VERBS:
            head, _ = phrase_head(phrase)
            rest = words[position + 1 + len(phrase) : position + 6 + len(phrase)]
            own = head is not None and head.lemma in lex.PROBLEM_NOUNS
            replaced = own and bool({w.text for w in rest} & _SELF_CHOSEN)
            tail = [*phrase, *rest]
            replaced = (
                replaced
                or any(  # "any question you like"
                    item.lemma in lex.PROBLEM_NOUNS
                    and tail[at + 1].text == "you"
                    and tail[at + 2].text in _WANTING
                    for at, item in enumerate(tail[:-2])
                )
            )
        if replaced:
            found.other = found.other_instead = True
    asked = _interrogative(clause) or asked_next
    if clause.instead and asked:
        found.other = found.other_instead = True
    # "Your task is to answer: who wrote Hamlet?", "the real question is: what is 1 + 1?": a
    # workflow's prompt serves every problem, so a question of its own that is not about the
    # problem or its answer is some other question.
    if following is not None and _interrogative(following) and _specific(following):
        # The task said to be that question ("your task is to answer:", "the real question
        # is:"); a guiding question ("consider: which operation is needed?") or a few-shot
        # example's "Question:" label says no such thing.
        texts = {w.text for w in words}
        introduces = bool(texts & lex.COPULAS) and any(
            not w.negated and w.lemma in _TASK_NOUNS for w in words
        )
        if introduces:
            found.other = found.other_instead = True


def _the_problem(phrase: list[Word]) -> bool:
    """Whether a phrase names this problem itself ("this problem", "the task above"), not a
    piece of text ("a paragraph") or another problem."""
    head, modifiers = phrase_head(phrase)
    texts = {w.text for w in modifiers}
    return (
        head is not None
        and head.lemma in _TASK_NOUNS | lex.words("exercise puzzle prompt input")
        and not texts & lex.words("a an any some")
        and _problem_object(phrase)[0]
    )


def _interrogative(clause: Clause) -> bool:
    """A question of the clause's own ("what is the largest planet", "when did ... fall")."""
    content = [w for w in clause.words if w.text not in (",", ":") and w.text not in lex.FILLERS]
    if clause.sub in ("when", "where") and content and content[0].lemma in _AUXILIARIES:
        return len(content) >= 2  # the subordinator is the question word: "when did it fall"
    return len(content) >= 3 and content[0].text in _QUESTION_WORDS and not clause.conditional


_GENERIC: Final = (
    lex.ANSWER_NOUNS
    | lex.PROBLEM_NOUNS
    | lex.REASON_NOUNS
    | lex.PROBLEM_PRONOUNS
    | lex.DETERMINERS
    | lex.FILLERS
    | lex.COPULAS
    | _QUESTION_WORDS
    | lex.words(
        """
        it you your we us i me do does did can could should would will must may might to of in
        on for with from by about be has have had many much way correct right best exactly
        asked ask asks being given mean means need needs the a an
        """
    )
)
"""Words of a question about the problem or its answer ("what is the answer", "what does the
question ask"), which any problem's prompt may ask."""


def _specific(clause: Clause) -> bool:
    """A question with content of its own (a planet, a play, a sum), not about the problem."""
    return any(
        w.text not in _GENERIC
        and w.lemma not in _GENERIC
        and w.text.rstrip("s") not in _GENERIC
        and w.text not in (",", ":")
        for w in clause.words[1:]
    )


def _read_literal_after(clause: Clause, following: Clause | None, found: _Findings) -> None:
    """A constant named after a colon: "always reply: 8", "your answer, every time: 'yes'"."""
    if following is None or clause.conditional or following.conditional:
        return
    words = clause.words
    if {w.text for w in words} & lex.FORMAT_WORDS:
        return
    replying = any(
        not w.negated and ((w.verb and w.lemma in lex.REPLY_VERBS) or w.text in _OUTPUT_FORMS)
        for w in words
    ) or any(w.lemma in lex.ANSWER_NOUNS and not w.negated for w in words)
    constant = found.constancy or any(
        w.text in _CONSTANCY and not w.negated for w in words + following.words
    )
    if not (replying and constant):
        return
    content = [
        w
        for w in following.words
        if w.text not in (",", ":", ".")
        and w.text not in lex.FILLERS
        and w.text not in _CONSTANCY
        and w.text not in lex.DETERMINERS
        and w.text not in ("time", "times", "case", "cases")
    ]
    if len(content) == 1 and not content[0].negated and _literal_like(content[0]):
        found.literal = found.literal or content[0].text


_ORDINALS: Final = lex.words("first last second third final opening closing")
_PARTS: Final = lex.words("word letter sentence line character digit number token phrase")


def _part_of_problem(words: list[Word]) -> bool:
    """A piece of the problem's own text given as the reply: "the first word of the question"."""
    for position in range(len(words) - 3):
        ordinal, part, of = words[position : position + 3]
        if ordinal.negated or ordinal.text not in _ORDINALS or of.text != "of":
            continue
        if part.text.rstrip("s") not in _PARTS:
            continue
        following = [w for w in words[position + 3 : position + 6] if w.text not in lex.DETERMINERS]
        if following and following[0].lemma in lex.PROBLEM_NOUNS:
            return any(w.verb and not w.negated for w in words[:position])
    return False


def _with_object(rest: list[Word]) -> set[str]:
    """The lemmas of what a verb is done *with* ("answer with a poem")."""
    if not rest or rest[0].text != "with":
        return set()
    return {w.lemma for w in rest[1:] if w.text not in NP_STOP} | {w.text for w in rest[1:]}


def _random_here(words: list[Word]) -> bool:
    return any(w.text in ("random", "randomly", "arbitrary", "arbitrarily") for w in words)


def _random_answer(words: list[Word], position: int) -> bool:
    """Whether the random marker at ``position`` qualifies the answer (not test inputs or an
    order), in a clause that produces or gives an answer."""
    word = words[position]
    following = [
        w for w in words[position + 1 : position + 5] if w.text not in ("chosen", "picked", ",")
    ]
    target = next((w for w in following if w.text not in lex.DETERMINERS), None)
    if target is not None and (target.text in lex.TEST_NOUNS or target.lemma in lex.TEST_NOUNS):
        return False
    is_answer = target is not None and target.lemma in lex.ANSWER_NOUNS and not target.verb
    if is_answer and target is not None:
        after = words.index(target) + 1
        if after < len(words) and words[after].text == "of":
            return False  # "any number of arguments"
    adverb = word.text in ("randomly", "arbitrarily")
    if not is_answer and not adverb:
        return False
    if word.text in ("whatever", "any") and (
        target is None or target.lemma not in lex.RANDOM_TARGETS
    ):
        return False
    producing = any(
        w.verb
        and not w.negated
        and (
            w.lemma in lex.PRODUCE_VERBS
            or w.lemma in lex.REPLY_VERBS
            or w.lemma in lex.ENGAGE_VERBS
            or w.lemma in lex.INVENT_VERBS
            or w.lemma in ("choose", "pick", "select")
        )
        for w in words
    ) or any(w.text in lex.COPULAS for w in words)
    return producing


_OUTPUT_FORMS: Final = lex.words(
    """
    return returns returning output outputs print prints answer answers reply replies respond
    responds say says give gives yield yields emit emits write writes put
    """
)


def _read_literals(clause: Clause, found: _Findings) -> None:
    """A constant named as the answer, an empty reply, a stub."""
    words = clause.words
    texts = [w.text for w in words]
    if clause.conditional or set(texts) & lex.FORMAT_WORDS:
        return
    for position, word in enumerate(words):
        if word.negated:
            continue
        placeholder = PLACEHOLDER.match(word.text)
        if placeholder and placeholder.group(1) == "c":  # a trivial body: `pass`, `return 0`
            found.constant = True
            found.literal = found.literal or word.text
            continue
        if word.text in ("sameconst", "hardcode", "stub", "symbolconst"):
            found.constant = True
            continue
        if word.text in ("empty", "refusalq") and _output_before(words, position):
            found.empty = True
            continue
        if word.text == "nothing" and _output_before(words, position):
            found.empty = True
            continue
        if not _output_before(words, position):
            continue
        literal = _literal_at(words, position)
        if literal is not None:
            found.literal = found.literal or literal
            return


def _output_before(words: list[Word], position: int) -> bool:
    """An output verb positive before ``position`` in the clause, or a copula whose subject is
    the answer or the reply ("the reply is 7 in every case")."""
    for index, word in enumerate(words[:position]):
        if word.negated:
            continue
        if word.text in _OUTPUT_FORMS or (word.verb and word.lemma in lex.REPLY_VERBS):
            return True
        if word.text in lex.COPULAS and any(
            w.lemma in lex.ANSWER_NOUNS and not w.verb for w in words[:index]
        ):
            return True
    return False


def _literal_like(word: Word) -> bool:
    return bool(
        PLACEHOLDER.match(word.text)
        or NUMBER.fullmatch(word.text)
        or word.text in lex.NUMBER_WORDS
        or word.text in lex.NULL_WORDS
    )


def _unit(word: Word | None) -> bool:
    if word is None:
        return False
    text = word.text
    return (
        text in lex.UNIT_NOUNS or word.lemma in lex.UNIT_NOUNS or text.rstrip("s") in lex.UNIT_NOUNS
    )


def _literal_at(words: list[Word], position: int) -> str | None:
    word = words[position]
    nxt = words[position + 1] if position + 1 < len(words) else None
    prev = words[position - 1] if position > 0 else None
    after = words[position + 2] if position + 2 < len(words) else None
    alternatives = (
        (nxt is not None and nxt.text in ("or", "/"))
        or (prev is not None and prev.text in ("or", "/", "either"))
        or (nxt is not None and nxt.text == "and" and after is not None and _literal_like(after))
    )
    if alternatives:
        return None
    if PLACEHOLDER.match(word.text):
        return word.text  # a quoted literal, resolved by read_directives
    if NUMBER.fullmatch(word.text) or word.text in lex.NUMBER_WORDS:
        content = nxt is not None and not (
            nxt.text in NP_STOP or nxt.text in lex.MARKERS or nxt.text == ","
        )
        if _unit(nxt) or content:
            return None  # a count ("3 sentences", "5 apples"), not the answer
        return word.text
    if word.text in lex.NULL_WORDS:
        return word.text
    if prev is not None and (prev.text in lex.LITERAL_NOUNS or prev.text == "oneshort"):
        known = (
            word.text in lex.LEMMAS
            or word.text in lex.MARKERS
            or word.text in NP_STOP
            or word.text in lex.DETERMINERS
            or word.text in lex.FILLERS
            or word.text.startswith("tag_")
        )
        plain = word.text.isalpha() and len(word.text) > 1 and word.text not in TEMPLATE_WORDS
        if not known and plain and (nxt is None or nxt.text in lex.FILLERS):
            return word.text
    return None
