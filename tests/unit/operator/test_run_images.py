"""Images of runs: unset ones come from the operator's settings (the chart's runDefaults), a
run's own always wins, and pods without GPUs run the CPU image."""

from __future__ import annotations

from aflowrl.config import ImageDefaults, RunSpec
from aflowrl_operator.cli import build_parser, operator_config
from aflowrl_operator.validation import with_default_images


def test_an_empty_spec_leaves_every_image_to_the_operator():
    images = RunSpec().images
    assert (images.env, images.gpu, images.cpu) == (None, None, None)


def test_unset_images_take_the_operators_registry_and_tag_and_set_ones_stay():
    args = ["--run-image-registry", "mirror.example/ml", "--run-image-tag", "7"]
    config = operator_config(build_parser().parse_args(args))
    spec = RunSpec.from_document({"images": {"gpu": "own/gpu:1"}})
    images = with_default_images(spec, config.run_images).images
    assert images.env == "mirror.example/ml/aflow-rl-env:7"
    assert images.cpu == "mirror.example/ml/aflow-rl-cpu:7"
    assert images.gpu == "own/gpu:1"


def test_an_image_given_in_full_overrides_registry_and_tag():
    config = operator_config(build_parser().parse_args(["--run-cpu-image", "x/cpu@sha256:ab"]))
    assert config.run_images.image("cpu") == "x/cpu@sha256:ab"
    assert config.run_images.image("env") == "ghcr.io/aflow-rl/aflow-rl-env:0.1.0"


def test_pods_without_gpus_run_the_cpu_image():
    images = with_default_images(RunSpec(), ImageDefaults(registry="r", tag="t")).images
    assert images.torch_image(0) == "r/aflow-rl-cpu:t"
    assert images.torch_image(2) == "r/aflow-rl-gpu:t"
