"""Weight-push MB/s through gRPC (learner rank 0 -> rollout) against a raw loopback socket copy.

Starts a learner and an hf rollout (``aflowrl serve``, real processes) on a generated Qwen2 model
of about 100 MB (float32), trains one tiny step per round so the learner has a new version, and
times :class:`aflowrl.trainer.weight_sync.GrpcWeightSync` pushing it: gathering the weights,
checksumming, streaming them from the learner to the rollout, verifying and swapping them in.
The baseline sends the same number of bytes through a plain TCP socket on loopback in this
process (the upper bound of any transport here), once per round just before the round's push,
so that each push is compared with the machine as it was that moment. Prints the median rates,
each round's ratio, and the median ratio.

    python bench/weight_push.py [--hidden 512] [--layers 8] [--rounds 5] [--warmup 1]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from aflowrl._proto.v1 import learner_pb2, learner_pb2_grpc
from aflowrl.common.client import ChannelOptions, make_channel
from aflowrl.trainer.weight_sync import GrpcWeightSync

ROOT = Path(__file__).resolve().parent.parent


def _services() -> Any:
    """The integration tests' process launcher and model builder (tests/integration)."""
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    import policy_services

    return policy_services


def socket_copy(nbytes: int, chunk: int = 4 * 1024 * 1024) -> float:
    """MB/s of sending ``nbytes`` through a loopback TCP connection (receiver in a thread)."""
    payload = memoryview(bytes(nbytes))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    received = bytearray(nbytes)

    def receive() -> None:
        connection, _ = server.accept()
        view, got = memoryview(received), 0
        while got < nbytes:
            got += connection.recv_into(view[got:], min(chunk, nbytes - got))
        connection.close()

    thread = threading.Thread(target=receive)
    thread.start()
    started = time.perf_counter()
    with socket.create_connection(server.getsockname()) as client:
        for offset in range(0, nbytes, chunk):
            client.sendall(payload[offset : offset + chunk])
    thread.join()
    seconds = time.perf_counter() - started
    server.close()
    return nbytes / seconds / 1e6


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="aflowrl-bench-"))
    try:
        model_dir = work / "model"
        model_dir.mkdir()
        services = _services()
        nbytes = services.build_model(model_dir, args.hidden, args.layers)
        spec = work / "spec.yaml"
        spec.write_text(
            f"policy: {{model: {model_dir}}}\n"
            "learner: {loss: {miniBatchSize: 1, microBatchSize: 1, klCoef: 0.0}}\n"
            f"weightTransport: {{type: grpc, chunkMib: {args.chunk_mib}}}\n"
        )
        learner = services.start_service("learner", spec, work, timeout=300)
        rollout = services.start_service("rollout", spec, work, timeout=300)
        try:
            channel = make_channel(learner.target, ChannelOptions(timeout_s=600))
            stub = learner_pb2_grpc.LearnerServiceStub(channel)
            sample = learner_pb2.TrainSample(
                sequence=learner_pb2.Sequence(prompt_token_ids=[5, 6], response_token_ids=[7, 8]),
                old_logprobs=[-7.0, -7.0],
                advantages=[1.0, 1.0],
            )
            sync = GrpcWeightSync(
                learner.target, [rollout.target], chunk_bytes=args.chunk_mib * 1024 * 1024
            )
            rates, raws = [], []
            for iteration in range(args.warmup + args.rounds):
                await stub.Train(learner_pb2.TrainRequest(samples=[sample], iteration=iteration))
                # The baseline of each round in the same minute as its push: the machine's
                # speed drifts more between minutes than between the two.
                raw = socket_copy(nbytes)
                report = await sync.push()
                assert report.ok, report
                if iteration >= args.warmup:
                    rates.append(report.replicas[0].bytes / report.seconds / 1e6)
                    raws.append(raw)
            await sync.close()
            await channel.close()
        finally:
            rollout.stop()
            learner.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [r / b for r, b in zip(rates, raws, strict=True)]
    print(f"model: {nbytes / 1e6:.1f} MB float32 ({args.hidden} hidden, {args.layers} layers)")
    print(
        f"grpc push (gather, checksum, stream, verify, swap) {statistics.median(rates):8.1f} MB/s "
        f"(median of {args.rounds}, after {args.warmup} untimed)"
    )
    print(f"raw loopback socket copy                       {statistics.median(raws):8.1f} MB/s")
    print(f"per round grpc/raw: {' '.join(f'{r:.3f}' for r in ratios)}")
    print(f"ratio grpc/raw = {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed rounds first, on both sides (a run pushes every iteration: the steady "
        "state is what it pays; a process's first push also sets up its channel and heap)",
    )
    asyncio.run(main(parser.parse_args()))
