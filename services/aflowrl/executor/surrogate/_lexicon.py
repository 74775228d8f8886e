"""Word families for reading instructions: what a word *does* in a request, by its lemma.

:mod:`.directives` reads an instruction compositionally (clauses, negation scope, verbs and
their objects); this module only says which family each word belongs to, so the reading rules
are written once over families and never over phrases:

* verbs: reasoning (``derive``, ``decompose``, ``verify``...), verbs that produce text
  (``give``, ``write``, ``output``...; they ask for reasoning only when their object is
  reasoning: "write out the intermediate values"), engagement with the problem (``solve``,
  ``read``, ``address``...), disregard (``ignore``, ``skip``...; they negate their object),
  other negators (``avoid``, ``omit``, ``refrain``...), echoing (``repeat``, ``copy``...),
  unrelated work (``translate``, ``sing``...) and invention (``invent``, ``guess``...);
* nouns: the problem itself (``question``, ``task``, ``passage``...), the answer
  (``answer``, ``result``, ``value``...), reasoning (``derivation``, ``sub-problem``,
  ``edge case``...), unrelated work (``poem``, ``joke``...), tests (``test``, ``sample``);
* markers: brevity, verbosity, randomness, "always", hidden thinking, immediacy.

Multi-word expressions are first rewritten to one token (``pay no attention to`` -> ``not
attend``, ``step by step`` -> ``stepwise``); inflections map to lemmas by a few suffix rules.
Used only by :mod:`.directives`.
"""

from __future__ import annotations

import re
from typing import Final


def words(text: str) -> frozenset[str]:
    """The whitespace-separated words of ``text``: how the families below are written."""
    return frozenset(text.split())


# --- multi-word expressions -> one token --------------------------------------------------------

MULTIWORD: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        # negation carried by a phrase
        (r"\bpay(?:s|ing)? (?:no|zero|little) (?:heed|attention|mind) to\b", "not attend"),
        (
            r"\b(?:(?:is|are|am|be) )?(?:not|never) (?:required|necessary|needed|obliged|"
            r"expected|asked) to\b",
            "no need",
        ),
        (r"\b(?:give|giving|gave) up\b", "not attempt"),
        (
            r"\b(?:is|are|be|being) (?:not|never) (?:needed|necessary|required|wanted|expected|"
            r"desired|useful|helpful|important|allowed|permitted|welcome)\b",
            "unnecessary",
        ),
        (r"\bnot (?:needed|required|necessary|wanted|welcome)\b", "unnecessary"),
        (r"\b(?:there is |there are )?no need (?:to|for)\b", "no need"),
        (r"\bno point in\b", "no need"),
        (r"\bnot bother(?:ing)?(?: to| with| about)?\b", "not"),
        (r"\bbother(?:ing)? (?:to|with)\b", ""),
        (r"\b(?:instead of|rather than|in place of)\b", "instead_of"),
        (r"\b(?:leave|leaving|left) out\b", "omit"),
        (r"\b(?:cut|cutting) (?:out|short)\b", "omit"),
        (r"\b(?:cut|cutting) corners\b", "skimp"),
        (r"\b(?:get|getting) rid of\b", "omit"),
        (r"\b(?:do|doing) away with\b", "omit"),
        (r"\b(?:set|setting) aside\b", "ignore"),
        (r"\bforget about\b", "forget"),
        # reasoning
        (
            r"\b(?:step|stage|piece|bit|line|sentence|point|clause|part) by "
            r"(?:step|stage|piece|bit|line|sentence|point|clause|part)\b",
            "stepwise",
        ),
        (r"\bone (?:step|stage|piece|part|thing) at a time\b", "stepwise"),
        (r"\bin (?:stages|steps)\b", "stepwise"),
        (r"\bchain of thoughts?\b", "cot"),
        (r"\bthought process(?:es)?\b", "reasoning"),
        (r"\b(?:line|train) of (?:reasoning|thought|argument)\b", "reasoning"),
        (r"\b(?:edge|corner|boundary|special|degenerate|extreme) cases?\b", "edgecase"),
        (r"\bsub (?:problems?|goals?|tasks?|questions?|steps?|results?)\b", "subproblem"),
        (
            r"\b(?:work|working|worked|works|reason|reasoning|reasoned|figure|figuring|figured|"
            r"think|thinking|thought|sort|sorting|puzzle|puzzling|hash|hashing) (?:it |this |"
            r"that |them |everything |things |each one )?(?:out|through)\b",
            "derive",
        ),
        (r"\b(?:work|working|reason|reasoning|think|thinking) backwards?\b", "derive"),
        (r"\bpseudo code\b", "pseudocode"),
        (
            r"\b(?:a |one |single )?(?:period|full stop|dot|comma|question mark|exclamation "
            r"(?:mark|point)|dash|hyphen|asterisk|emoji|smiley|space|newline|blank line)\b",
            "symbolconst",
        ),
        (
            r"\b(?:walk|walking|walked|step|stepping|go|going|went|run|running|talk|talking|"
            r"reason|reasoning) (?:me |us |yourself )?(?:through|over)\b",
            "trace",
        ),
        (
            r"\b(?:break|breaking|broke|broken|split|splitting) (?:it |this |that |them |the "
            r"(?:problem|question|task) )?(?:down|up|apart|into)\b",
            "decompose",
        ),
        (r"\b(?:double|triple|cross|sanity|spot) checks?\b", "verify"),
        (r"\b(?:double|triple|cross|sanity|spot) check(?:ing|ed)\b", "verify"),
        (r"\bmake sure\b", "ensure"),
        (
            r"\b(?:write|writing|wrote|written|lay|laying|laid|set|setting|spell|spelling|"
            r"spelled|spelt|jot|jotting|jotted|map|mapping|mapped|note|noting|noted) "
            r"(?:down|out)\b",
            "write_out",
        ),
        (r"\bthink about\b", "consider"),
        (r"\btake into account\b", "consider"),
        (r"\bcome up with\b", "produce"),
        (r"\bfocus on\b", "attend"),
        (r"\bpay (?:close |careful )?attention to\b", "attend"),
        (r"\blook(?:ing|ed|s)? (?:at|over|into)\b", "attend"),
        (r"\bwork(?:ing|ed|s)? on\b", "address"),
        (r"\bdeal(?:ing|t|s)? with\b", "address"),
        (r"\brespond(?:ing|ed|s)? to\b", "address"),
        (r"\bin (?:great |full |more |much )?(?:detail|depth|full)\b", "indetail"),
        (r"\bat (?:great |some )?length\b", "indetail"),
        # invention and randomness
        (r"\b(?:make|making|made) up\b", "invent"),
        (
            r"\b(?:pull|pulled|pulling) (?:a number |one |an answer )?out of (?:thin air|a hat)\b",
            "invent",
        ),
        (r"\bat random\b", "randomly"),
        (r"\b(?:flip|flipping|toss|tossing) a coin\b", "randomly"),
        (r"\broll(?:ing)? (?:a |the )?dic?e\b", "randomly"),
        (r"\b(?:first )?comes? to (?:mind|your mind)\b", "randomly"),
        (r"\bpops? into your head\b", "randomly"),
        (r"\boff the top of your head\b", "immediately"),
        # unconditional
        (r"\b(?:regardless of|irrespective of|independent(?:ly)? of|no matter)\b", "always"),
        (r"\b(?:every|each) (?:single )?time\b", "always"),
        (r"\bin (?:all|every|any) cases?\b", "always"),
        (
            r"\bfor (?:every|each|all|any) (?:single )?(?:inputs?|questions?|problems?|cases?|"
            r"arguments?|calls?|values?|queries?|tasks?)\b",
            "always",
        ),
        # hidden or immediate answering
        (r"\b(?:in|inside) your (?:head|mind)\b", "silently"),
        (r"\bto yourself\b", "silently"),
        (r"\b(?:right|straight) away\b", "immediately"),
        (r"\b(?:at once|without delay|on the spot|straight off)\b", "immediately"),
        # restrictions and their locations
        (r"\bonly then\b", "then"),
        (r"\band then\b", "then"),
        (
            r"\b(?:after that|after this|after which|after doing so|after you are done|"
            r"having done (?:so|that|this))\b",
            "then",
        ),
        (
            r"\b(?:once|when|after) (?:you are |you have |you've |it is )?(?:done|finished|"
            r"through|complete|completed|ready)\b",
            "then",
        ),
        (r"\b(?:at|in|towards?) the (?:very )?end\b", "atend"),
        (
            r"\b(?:nothing|none) (?:else|more|further|additional|extra|other|besides|beyond)\b",
            "nothing_else",
        ),
        (r"\bnothing but\b", "only"),
        (
            r"\bno (?:other|additional|extra|further|surrounding) (?:text|words?|content|"
            r"commentary|output|prose|remarks?|sentences?|lines?)\b",
            "nothing_else",
        ),
        (r"\b(?:on|by) (?:its|it|their|them)(?:selves|self)? own\b", "alone"),
        (r"\bby (?:itself|themselves)\b", "alone"),
        (r"\b(?:word for word|verbatim|as is|exactly as (?:written|given|stated))\b", "verbatim"),
        (r"\b(?:stop|end) (?:there|then|here|immediately)\b", "nothing_else"),
        (r"\band stop\b", "nothing_else"),
        (
            r"\b(?:a single|one single|just one|only one|exactly one|single|one|in a) (?:word|"
            r"number|integer|value|token|line|phrase|sentence|figure|digit|name|term)\b",
            "oneshort",
        ),
        (r"\b(?:few|couple of|handful of) words\b", "oneshort"),
        (r"\bto the point\b", "concise"),
        (
            r"\b(?:the|your|its|a) (?:very )?(?:last|final|closing|bottom|concluding) "
            r"(?:line|sentence|part|bit|word)\b",
            "answerline",
        ),
        (r"\bthat line\b", "answerline"),
        (
            r"\b(?:end|ends|ending|finish|finishes|finishing|conclude|concludes|close|closes) "
            r"(?:it |your (?:reply|response|answer) )?with\b",
            "atend",
        ),
        (
            r"\bthe same (?:answer|value|number|output|result|thing|string|word|reply|response)\b",
            "sameconst",
        ),
        (
            r"\b(?:a|the) (?:fixed|constant|hard coded|hardcoded|predetermined|preset) "
            r"(?:answer|value|number|output|result|string|reply|response)\b",
            "sameconst",
        ),
        (r"\bhard (?:code|coded|coding|codes)\b", "hardcode"),
        (r"\b(?:an? |the )?(?:empty|blank) (?:body|function|implementation|stub)\b", "stub"),
        (
            r"\b(?:an? |the )?(?:empty|blank|null|zero length) (?:string|message|reply|response|"
            r"answer|output|line|text|list|array|dict|dictionary|tuple|set)\b",
            "empty",
        ),
        (r"\bsilence\b", "empty"),
        (r"\b(?:stay|remain|keep) (?:silent|quiet|mute)\b", "say empty"),
        (r"\b(?:do|say|write|output|return|print) nothing\b", "say empty"),
        (
            r"\b(?:i|you|it|we|they) (?:not|can not|could not|am unable to|are unable to|is "
            r"unable to|will not|would not) (?:know|answer|tell|help|solve|be sure|say)\b|"
            r"\b(?:i|you|it|we|they) (?:am|are|is) (?:not|un)(?: )?(?:sure|certain)\b",
            "refusalq",
        ),
        (
            r"\b(?:leave|leaves|leaving|left|keep|keeping) (?:the |your |this |that |it )?"
            r"(?:answer |reply |response |output |body |function |implementation |code )?"
            r"(?:blank|empty|unanswered|unimplemented|unfinished)\b",
            "say empty",
        ),
        (r"\bcapital of\b", "trivia"),
        (r"\boff topic\b", "offtopic"),
        (r"\bfun facts?\b", "trivia"),
        (r"\b(?:your |my )?favou?rite\b", "trivia"),
        (r"\bthe weather\b", "trivia"),
        (r"\b(?:for example|for instance|such as)\b", "eg"),
    )
)
"""Applied in order to the lower-cased instruction, before it is cut into words."""

# --- verbs ----------------------------------------------------------------------------------------

REASON_VERBS: Final = words(
    """
    think reason explain justify derive deliberate reflect ponder contemplate analyze analyse
    decompose plan trace verify validate deduce infer brainstorm rationalize elaborate examine
    inspect scrutinize scrutinise check confirm test simulate enumerate evaluate assess consider
    reconsider investigate diagnose stepwise ensure annotate prove argue compare outline sketch
    restate rephrase paraphrase summarize summarise identify establish clarify
    """
)
"""Verbs that ask for reasoning whatever their object ("verify", "decompose the problem")."""

PRODUCE_VERBS: Final = words(
    """
    give write write_out show state provide present include put list note record describe report
    output return print produce generate emit say type offer submit display express end finish
    conclude close begin start open keep leave make use set have let deliver spell supply yield
    draft compose tell reply respond answer
    """
)
"""Verbs that produce text; they ask for reasoning only when their object is reasoning."""

REPLY_VERBS: Final = words(
    """
    reply respond answer output return print emit say type produce
    """
)
"""Verbs whose object is the whole reply ("reply with only the number")."""

ENGAGE_VERBS: Final = words(
    """
    solve answer read attend address attempt tackle handle process study understand use consider
    do work compute calculate find determine figure complete approach
    """
)
"""Verbs of engaging with the problem ("solve it", "read the question")."""

DISREGARD_VERBS: Final = words(
    """
    ignore disregard overlook neglect skip forget bypass sidestep dismiss abandon discard drop
    """
)
"""Verbs that turn away from their object: they negate it, and the problem given to them is
discarded."""

NEGATOR_VERBS: Final = words(
    """
    avoid refrain omit stop cease forgo forego exclude eliminate remove delete suppress withhold
    hide spare ditch dispense decline refuse skimp replace prevent resist abstain
    """
)
"""Verbs that negate what follows ("avoid explaining", "omit the steps")."""

ECHO_VERBS: Final = words(
    """
    repeat echo copy reproduce parrot recite quote transcribe duplicate mirror reprint
    regurgitate
    """
)
"""Verbs that give the problem back instead of answering it."""

OTHER_VERBS: Final = words(
    """
    translate sing rhyme draw chat greet joke alphabetize encode encrypt reverse scramble
    """
)
"""Verbs of some other work than answering."""

INVENT_VERBS: Final = words("invent fabricate guess randomize")
"""Verbs of answering without working it out ("invent an answer", "guess")."""

COPULAS: Final = words("is are be being been was were equals equal")

# --- nouns ----------------------------------------------------------------------------------------

PROBLEM_NOUNS: Final = words(
    """
    question problem task query prompt input exercise puzzle request statement passage context
    text document paragraph user item challenge riddle assignment
    """
)
"""Heads of noun phrases that name the problem itself."""

PROBLEM_PRONOUNS: Final = words("it this that everything above following all")
"""Pronouns that stand for the problem when an engagement or disregard verb takes them."""

DETERMINERS: Final = words(
    """
    the a an this that these those your my our their its his her each every any all some no
    given provided above following entire whole
    """
)

OTHER_ADJECTIVES: Final = words(
    """
    different another other unrelated new separate alternative second easier simpler irrelevant
    random
    """
)
"""Adjectives that make a problem noun name some other problem ("a different question")."""

ANSWER_NOUNS: Final = words(
    """
    answer result number value solution output response reply conclusion integer figure total
    letter word name phrase code function program implementation guess choice one final oneshort
    count amount sum string expression body verdict
    """
)
"""Heads that name the answer (or the reply holding it)."""

ANSWER_LOCATIONS: Final = words("answerline atend conclusion tag boxed")
"""Words that place a restriction on the answer part of a reply, not on the reply."""

REASON_NOUNS_PLAIN: Final = words(
    """
    reasoning thought thinking cot explanation justification rationale derivation workings
    intermediate breakdown walkthrough scratchpad subproblem edgecase deduction stepwise
    pseudocode
    """
)
"""Nouns that can only mean reasoning: they count wherever they stand."""

REASON_NOUNS: Final = REASON_NOUNS_PLAIN | words(
    """
    reason work working step calculation approach intuition computation arithmetic analysis plan
    outline logic proof trace scratch requirement constraint known unknown quantity relationship
    equation strategy evidence inference sketch stage
    """
)
"""Nouns that name reasoning: asked for when produced, forbidden when negated. Those not in
:data:`REASON_NOUNS_PLAIN` count only at the start of a noun phrase or after a determiner or
a reasoning word ("each step", "your working"), not after another noun ("the last step",
"floating point arithmetic")."""

OTHER_NOUNS: Final = words(
    """
    poem poetry haiku limerick sonnet song lyric story tale joke pun essay recipe letter email
    tweet slogan advertisement rap ode fable anecdote trivia horoscope greeting compliment
    drawing picture translation gibberish nonsense lorem ipsum babble rubbish garbage filler
    unrelated irrelevant offtopic
    """
)
"""Products of some other work than answering (and what makes a product unrelated to it)."""

UNIT_NOUNS: Final = words(
    """
    decimal place places digit digits significant sentence sentences word words line lines space
    spaces step steps example examples test tests time times character characters point points
    percent paragraph paragraphs bullet bullets item items option options candidate candidates
    letter letters tab tabs
    """
)
"""Nouns after a numeral that make it a count, not an answer ("in 3 sentences")."""

TEST_NOUNS: Final = words(
    "test tests input inputs example examples case cases sample samples seed order data"
)
"""What "random" may legitimately qualify ("random test inputs", "in random order")."""

# --- markers --------------------------------------------------------------------------------------

NEGATORS: Final = words("not never no nor neither none without zero instead_of")
COMMA_SCOPED: Final = words("without instead_of")
"""Negators whose scope ends at the next comma ("without explaining, give the number")."""

POSTPOSED_NEGATORS: Final = words(
    """
    unnecessary unneeded needless superfluous pointless forbidden prohibited banned disallowed
    undesirable unwanted redundant optional overkill
    """
)
"""Words that negate what comes before them ("reasoning is unnecessary")."""

BREVITY: Final = words(
    """
    brief briefly concise concisely short shortly succinct succinctly terse tersely compact
    compactly minimal minimally crisp oneshort laconic
    """
)
VERBOSE: Final = words(
    """
    indetail detailed thorough thoroughly elaborate comprehensive comprehensively exhaustive
    exhaustively lengthy extensive extensively justify
    """
)
RESTRICTORS: Final = words("only just solely merely exclusively alone bare nothing_else")
RANDOM: Final = words("random randomly arbitrary arbitrarily whatever any")
"""``whatever`` and ``any`` count only before one of :data:`RANDOM_TARGETS`."""
RANDOM_TARGETS: Final = words("number value answer integer word letter digit result guess one")
"""What "any" and "whatever" must qualify to make the answer random ("pick any number")."""
ALWAYS: Final = words("always constantly invariably unconditionally whatever")
HIDDEN: Final = words("silently internally privately mentally quietly secretly")
IMMEDIATE: Final = words("immediately instantly directly promptly outright")
SEQUENCERS: Final = words("then afterwards afterward finally lastly subsequently")
CONTRASTS: Final = words("but however although though whereas")
SUBORDINATORS: Final = words(
    "if unless until till before after when whenever once because since while lest"
)
CONDITIONS: Final = words("if unless when whenever lest otherwise else")
TEMPORAL_BLOCKERS: Final = words(
    """
    just only merely simply directly immediately yet first hastily quickly prematurely rush
    blindly enough sufficient sufficiently too before until unless without alone again twice
    initially
    """
)
"""Words that turn "do not answer" into a demand for more than the answer, not a refusal."""
FILLERS: Final = words(
    """
    unchanged intact exactly literally backwards backward reversed aloud twice
    please entirely completely altogether fully wholly totally whatsoever here there now below
    above provided given shown following at all back again kindly
    """
)
MODALS: Final = words(
    """
    to do does should must will can could would may might shall need needs have has let lets you
    we us i please just only simply merely also then first now always never not carefully kindly
    try sure remember and or nor instead_of without from before after by of in
    """
)
"""Words after which a verb is in verb position (imperative, infinitive, gerund)."""
NUMBER_WORDS: Final = words(
    """
    zero two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety
    hundred thousand million
    """
)
NULL_WORDS: Final = words("none null nil nan undefined true false")
LITERAL_NOUNS: Final = words(
    "word string text phrase letter character token value number constant digit"
)
"""Nouns that introduce a literal ("the single word banana", "the number 17")."""
FORMAT_WORDS: Final = words("eg like format form formatted pattern template shape")
"""Words that make a literal an example of the format, not the answer to give."""

# --- lemmas ---------------------------------------------------------------------------------------

_IRREGULAR: Final = {
    "thought": "think",
    "written": "write",
    "wrote": "write",
    "gave": "give",
    "given": "give",
    "shown": "show",
    "showed": "show",
    "chose": "choose",
    "chosen": "choose",
    "said": "say",
    "made": "make",
    "told": "tell",
    "left": "leave",
    "kept": "keep",
    "began": "begin",
    "begun": "begin",
    "did": "do",
    "done": "do",
    "does": "do",
    "forgot": "forget",
    "forgotten": "forget",
    "put": "put",
    "set": "set",
    "read": "read",
    "found": "find",
    "has": "have",
    "had": "have",
    "went": "go",
    "gone": "go",
    "sang": "sing",
    "sung": "sing",
    "drew": "draw",
    "drawn": "draw",
    "understood": "understand",
    "proven": "prove",
    "workings": "working",
    "analyses": "analysis",
    "hypotheses": "hypothesis",
    "stories": "story",
    "queries": "query",
    "quantities": "quantity",
    "poetry": "poetry",
    "lyrics": "lyric",
}


def _forms(lemma: str) -> set[str]:
    """Regular inflections of ``lemma`` (verbs and nouns): -s, -es, -ed, -ing, -ies."""
    forms = {lemma, lemma + "s", lemma + "es", lemma + "ed", lemma + "ing"}
    if lemma.endswith("e"):
        forms |= {lemma + "d", lemma[:-1] + "ing"}
    if lemma.endswith("y") and lemma[-2:-1] not in "aeiou":
        forms |= {lemma[:-1] + "ies", lemma[:-1] + "ied"}
    if re.fullmatch(r".*[^aeiou][aeiou][bdgmnprt]", lemma) and len(lemma) <= 5:
        forms |= {lemma + lemma[-1] + "ed", lemma + lemma[-1] + "ing"}
    return forms


_FAMILY_WORDS: Final = (
    REASON_VERBS
    | PRODUCE_VERBS
    | ENGAGE_VERBS
    | DISREGARD_VERBS
    | NEGATOR_VERBS
    | ECHO_VERBS
    | OTHER_VERBS
    | INVENT_VERBS
    | PROBLEM_NOUNS
    | ANSWER_NOUNS
    | REASON_NOUNS
    | OTHER_NOUNS
    | frozenset({"choose", "pick", "select", "go"})
)
VERB_LEMMAS: Final = (
    REASON_VERBS
    | PRODUCE_VERBS
    | ENGAGE_VERBS
    | DISREGARD_VERBS
    | NEGATOR_VERBS
    | ECHO_VERBS
    | OTHER_VERBS
    | INVENT_VERBS
    | frozenset({"choose", "pick", "select"})
)


def _lemma_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for lemma in sorted(_FAMILY_WORDS):
        for form in _forms(lemma):
            table.setdefault(form, lemma)
    for lemma in sorted(_FAMILY_WORDS):
        table[lemma] = lemma  # a lemma is never read as another lemma's inflection
    table.update(_IRREGULAR)
    return table


LEMMAS: Final = _lemma_table()

MARKERS: Final = (
    NEGATORS
    | POSTPOSED_NEGATORS
    | BREVITY
    | VERBOSE
    | RESTRICTORS
    | RANDOM
    | ALWAYS
    | HIDDEN
    | IMMEDIATE
    | SEQUENCERS
    | CONTRASTS
    | SUBORDINATORS
    | FILLERS
    | NUMBER_WORDS
    | NULL_WORDS
    | ANSWER_LOCATIONS
    | words("verbatim nothing_else empty sameconst hardcode stub refusalq trivia eg symbolconst")
)
"""Every marker word: never a literal answer, never the head of an object."""


def lemma(word: str) -> str:
    """The family lemma of ``word`` (itself when it belongs to no family)."""
    return LEMMAS.get(word, word)
