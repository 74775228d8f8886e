"""Steps 1 to 3 of reading an instruction (:mod:`.directives`): normalise, cut into clauses,
give every word its polarity, and find verbs and the noun phrases they take.

* :func:`normalise`: lower case, contractions expanded, quoted strings, inline code and reply
  tags set aside as placeholders that say what they hold (a trivial body ``c0_``, other code
  ``code_``, a template ``template_``, a quoted literal ``q0_``), a tag's content returned as
  its own segment with the tag as its scope.
* :func:`cut_clauses`: sentences cut into clauses at sequencers, contrasts, subordinators and new
  predicates, multi-word expressions made one token (:mod:`._lexicon`), each word marked
  negated or not and in verb position or not. Cached per sentence: the operators' prompts
  repeat the same sentences around each problem.
* :func:`object_phrase` and :func:`phrase_head`: the noun phrase a verb takes, and its head.

Used only by :mod:`.directives`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from typing import Final

from aflowrl.executor.surrogate import _lexicon as lex

# --- 1. normalisation ---------------------------------------------------------------------------

_QUOTES = str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"', "–": "-", "—": "-"})
_CONTRACTIONS: Final = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"\bcan't\b|\bcannot\b", "can not"),
        (r"\bwon't\b", "will not"),
        (r"\bshan't\b", "shall not"),
        (r"n't\b", " not"),
        (r"\b(it|that|there|here|what|this|who|where|which)'s\b", r"\1 is"),
        (r"\blet's\b", "let us"),
        (r"\bi'm\b", "i am"),
        (r"'re\b", " are"),
        (r"'ll\b", " will"),
        (r"'ve\b", " have"),
        (r"'d\b", " would"),
        (r"\b(?:do|does|did) not\b", "not"),
        (r"\b(?:do|does|did) never\b", "never"),
        (r"(?<=[a-z0-9])'s\b", " _pos"),
        (r"(?<=[a-z])-(?=[a-z])", " "),
        (r"\bw/o\b", "without"),
        (r"&", " and "),
    )
)
_CODE_SPAN = re.compile(r"`([^`\n]{1,200})`")
_DOUBLE_QUOTED = re.compile(r'"([^"\n]{1,200})"')
_SINGLE_QUOTED = re.compile(r"(?<![a-z0-9])'([^'\n]{1,120})'(?![a-z0-9])")
_TAG_SPAN = re.compile(r"<([a-z_]{1,30})>(.*?)</\1>", re.DOTALL)
_TAG = re.compile(r"</?([a-z_]{1,30})>")
_BOXED = re.compile(r"\\boxed\s*(?:\{[^{}]*\})?")
_SENTENCE = re.compile(r"[.!?;:]+(?=\s|$)|\n+|\(|\)|\[|\]")
_WORD = re.compile(r"-?[a-z0-9_/]+(?:\.[0-9]+)?|,")
PLACEHOLDER = re.compile(r"^(q|c)(\d+)_$")
_EXAMPLE = re.compile(r"\b(?:e\.g\.|i\.e\.)")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_QUOTED_WORDS = re.compile(r"[a-z/]+")
_TEMPLATE_MARKS = re.compile(r"[<{\[_]|\.\.\.")
_TRIVIAL_CODE = re.compile(
    r"^(?:pass|\.\.\.|return|return\s+(?:none|null|0|-?\d+(?:\.\d+)?|true|false|\[\]|\{\}|\(\)|"
    r"''|\"\"|'[^']*'|\"[^\"]*\")|raise\s+notimplementederror(?:\(\))?|none|null)\s*;?$"
)
TEMPLATE_WORDS = lex.words("answer result number value x n y your here final solution")
ANSWER_TAGS = frozenset({"answer", "final_answer", "final", "result", "solution_letter"})
REASON_TAGS = frozenset({"thought", "thinking", "reasoning", "scratchpad", "analysis", "think"})


@dataclass
class Spans:
    """What normalisation set aside: quoted strings and inline code, by placeholder."""

    quoted: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    tags: set[str] = field(default_factory=set)


def normalise(text: str, spans: Spans) -> list[tuple[str, str]]:
    """``text`` as (segment, scope) pairs: the instruction itself (scope ``reply``) and each
    reply tag's content (scope ``answer``, ``reasoning`` or ``reply``)."""
    low = text.translate(_QUOTES).lower()
    low = _BOXED.sub(" boxed ", low)

    # Set-aside text becomes a placeholder that says what it is: a trivial body (``c0_``, kept
    # as the constant it names), other code (``code_``), a quoted template (``template_``) or
    # a quoted literal (``q0_``). Two prompts that differ only in a function's name then read
    # alike, and their reading is shared (:func:`_read_normalised`).
    def code(found: re.Match[str]) -> str:
        content = found.group(1).strip()
        if not _TRIVIAL_CODE.match(content.lower()):
            return " code_ "
        spans.code.append(content)
        return f" c{len(spans.code) - 1}_ "

    def quoted(found: re.Match[str]) -> str:
        content = found.group(1).strip()
        if set(_QUOTED_WORDS.findall(content.lower())) & TEMPLATE_WORDS or _TEMPLATE_MARKS.search(
            content
        ):
            return " template_ "
        spans.quoted.append(content)
        return f" q{len(spans.quoted) - 1}_ "

    low = _CODE_SPAN.sub(code, low)
    low = _DOUBLE_QUOTED.sub(quoted, low)
    for pattern, replacement in _CONTRACTIONS[:11]:
        low = pattern.sub(replacement, low)
    low = _SINGLE_QUOTED.sub(quoted, low)
    for pattern, replacement in _CONTRACTIONS[11:]:
        low = pattern.sub(replacement, low)
    segments: list[tuple[str, str]] = []

    def tag_span(found: re.Match[str]) -> str:
        name = found.group(1)
        spans.tags.add(name)
        scope = "answer" if name in ANSWER_TAGS else "reply"
        scope = "reasoning" if name in REASON_TAGS else scope
        segments.append((found.group(2), scope))
        return f" tag_{name} "

    low = _TAG_SPAN.sub(tag_span, low)
    for name in _TAG.findall(low):
        spans.tags.add(name)
    low = _TAG.sub(lambda found: f" tag_{found.group(1)} ", low)
    return [(_EXAMPLE.sub(" eg ", low), "reply")] + [
        (_EXAMPLE.sub(" eg ", segment), scope) for segment, scope in segments
    ]


def _expressions(text: str) -> str:
    for pattern, replacement in lex.MULTIWORD:
        text = pattern.sub(replacement, text)
    return text


# --- 2. clauses -----------------------------------------------------------------------------------


@dataclass
class Word:
    text: str
    lemma: str
    negated: bool = False
    verb: bool = False


@dataclass
class Clause:
    words: list[Word] = field(default_factory=list)
    link: str = "start"
    """How the clause attaches: ``start``, ``then`` (a later part), ``but``, ``and``, ``sub``."""
    sub: str | None = None
    """The subordinator of a subordinate clause ("if", "until"...)."""
    scope: str = "reply"
    conditional: bool = False
    instead: bool = False


_CONDITIONAL_SENTENCE = re.compile(
    r"\b(?:if|unless|when|whenever|otherwise|else|lest|in case|where)\b|"
    r"\bfor (?:an? |the )?(?:empty|negative|invalid|missing|zero|null|none|odd|even|unknown|"
    r"bad|edgecase|non|out)\b|\bon (?:error|failure|invalid)\b"
)
NP_STOP: Final = lex.words(
    """
    of in into on onto for with to from by at about as than per via using like within inside
    across over under after before and or but nor , that which who whom whose so because then
    while until unless if when where whether
    """
)
WH: Final = lex.words("how why what whether")


def _is_verb_form(word: str) -> bool:
    return lex.lemma(word) in lex.VERB_LEMMAS


def cut_clauses(text: str, scope: str) -> list[Clause]:
    clauses: list[Clause] = []
    carried = False  # "Instead: what is ...?": a lone "instead" applies to what follows it
    for sentence in _SENTENCE.split(text):
        found = _sentence_clauses(" ".join(sentence.split()), scope)
        if not found and sentence.strip(" \t,;:.!?").lower() == "instead":
            carried = True
            continue
        for cached in found:
            if carried:  # a copy: the cached clauses are read only
                clauses.append(dataclasses.replace(cached, instead=True))
                carried = False
            else:
                clauses.append(cached)
    return clauses


@functools.lru_cache(maxsize=16_384)
def _sentence_clauses(sentence: str, scope: str) -> tuple[Clause, ...]:
    """The clauses of one sentence, polarised (cached: the operators' prompts repeat the same
    sentences around each problem's own words). Read only, never changed, once returned."""
    sentence = _expressions(sentence)
    tokens = _WORD.findall(sentence)
    if not tokens:
        return ()
    conditional = bool(_CONDITIONAL_SENTENCE.search(sentence))
    found = _split(tokens, scope)
    for clause in found:
        clause.conditional = conditional or clause.sub in lex.CONDITIONS
        _polarise(clause)
    return tuple(found)


def _split(tokens: list[str], scope: str) -> list[Clause]:
    """Clauses of one sentence (see the module docstring, step 2)."""
    clauses: list[Clause] = []
    current = Clause(scope=scope)
    negating = False
    pending_instead = False

    def close(link: str, sub: str | None = None) -> None:
        nonlocal current, negating, pending_instead
        if current.words and any(w.text != "," for w in current.words):
            clauses.append(current)
            current = Clause(link=link, sub=sub, scope=scope)
        else:
            current.link, current.sub = (current.link if current.link != "start" else link), sub
        negating = False
        current.instead, pending_instead = current.instead or pending_instead, False

    for position, token in enumerate(tokens):
        following = tokens[position + 1] if position + 1 < len(tokens) else ""
        if token in lex.SEQUENCERS:
            close("then")
            continue
        if token in lex.CONTRASTS:
            close("but")
            continue
        if token in lex.SUBORDINATORS:
            close("sub", token)
            continue
        if token == "instead":
            if current.words and any(w.text != "," for w in current.words):
                current.instead = True
            else:
                pending_instead = True
            continue
        new_predicate = following in ("just", "only", "simply", "merely") or (
            _is_verb_form(following) and not (negating and _list_follows(tokens, position + 1))
        )
        if token == "," and new_predicate:
            close("and")
            continue
        if token in ("and", "or", "nor") and _is_verb_form(following):
            if negating and (token != "and" or _same_family(current, following)):
                continue  # a list under one negation: "do not think or explain"
            close("and")
            continue
        current.words.append(Word(token, lex.lemma(token)))
        current.instead = current.instead or pending_instead
        pending_instead = False
        if token in lex.NEGATORS or lex.lemma(token) in lex.NEGATOR_VERBS | lex.DISREGARD_VERBS:
            negating = True
    close("and")
    return clauses


def _list_follows(tokens: list[str], start: int) -> bool:
    """Whether a coordinating "or"/"nor"/"and" closes a list before the sentence ends."""
    for token in tokens[start:]:
        if token in ("or", "nor", "and"):
            return True
        if token in lex.SEQUENCERS or token in lex.CONTRASTS or token in lex.SUBORDINATORS:
            return False
    return False


def _family(lemma: str) -> str:
    for name, members in (
        ("reason", lex.REASON_VERBS),
        ("engage", lex.ENGAGE_VERBS),
        ("produce", lex.PRODUCE_VERBS),
    ):
        if lemma in members:
            return name
    return lemma


def _same_family(clause: Clause, word: str) -> bool:
    verbs = [w.lemma for w in clause.words if w.lemma in lex.VERB_LEMMAS]
    return bool(verbs) and _family(verbs[-1]) == _family(lex.lemma(word))


# --- 3. polarity ----------------------------------------------------------------------------------


def _polarise(clause: Clause) -> None:
    """Set each word's polarity and whether it stands in verb position."""
    parity = 0
    comma_scoped = 0
    words = clause.words
    for position, word in enumerate(words):
        if word.text == ",":
            parity -= comma_scoped
            comma_scoped = 0
            continue
        word.negated = parity % 2 == 1
        word.verb = word.lemma in lex.VERB_LEMMAS and _verb_position(words, position)
        negates = word.text in lex.NEGATORS or (
            word.lemma in lex.NEGATOR_VERBS | lex.DISREGARD_VERBS and (word.verb or position == 0)
        )
        if negates:
            parity += 1
            if word.text in lex.COMMA_SCOPED:
                comma_scoped += 1
    for position, word in enumerate(words):
        if word.text in lex.POSTPOSED_NEGATORS:
            for before in words[:position]:
                before.negated = not before.negated


_ADVERB_SKIP: Final = lex.words(
    "first also then now just only simply merely always please again still carefully"
)


def _verb_position(words: list[Word], position: int) -> bool:
    before = position - 1
    while before >= 0 and (words[before].text in _ADVERB_SKIP or words[before].text.endswith("ly")):
        before -= 1
    word = words[position]
    if word.text != word.lemma and not word.text.endswith("ing"):
        return False  # "-s" and "-ed" forms are not imperatives: "tests", "the steps explained"
    if before < 0:
        return True
    previous = words[before]
    if previous.text in lex.MODALS or previous.text in lex.NEGATORS or previous.text == ",":
        return True
    gerund = words[position].text.endswith("ing")
    return gerund and previous.lemma in lex.NEGATOR_VERBS | lex.DISREGARD_VERBS


def object_phrase(words: list[Word], position: int) -> list[Word]:
    """The noun phrase after the verb at ``position`` (up to a preposition, conjunction,
    comma, relative pronoun or another verb)."""
    phrase: list[Word] = []
    for word in words[position + 1 :]:
        if word.text in NP_STOP or word.text in WH or word.verb:
            break
        phrase.append(word)
    return phrase


def phrase_head(phrase: list[Word]) -> tuple[Word | None, list[Word]]:
    """The head of a noun phrase and its modifiers (after a possessive, the possessed)."""
    if any(w.text == "_pos" for w in phrase):
        last = max(i for i, w in enumerate(phrase) if w.text == "_pos")
        phrase = phrase[last + 1 :]
    content = [w for w in phrase if w.text not in lex.MARKERS and not w.text.endswith("ly")]
    if not content:
        content = phrase
    if not content:
        return None, []
    return content[-1], content[:-1]
