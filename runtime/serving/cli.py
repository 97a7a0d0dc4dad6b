"""``serve`` and ``export-triton``: the serving commands of ``onnx-aot`` and ``python -m runtime``.

``runtime/cli.py`` adds these parsers (``add_serving_commands``) and runs them
(``run_serving_command``), so both command lines have them. Importing this module imports no Ray:
``serve`` imports it when it runs, and says how to install the ``serve`` extra where it is missing.
``serve`` prints one line, ``serving DIR at http://127.0.0.1:PORT/ROUTE``, once the route answers,
and on Ctrl-C or SIGTERM deletes the application and stops the Ray instance it started.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

__all__ = ["add_serving_commands", "run_serving_command", "SERVING_COMMANDS", "parse_autoscale"]

SERVING_COMMANDS = ("serve", "export-triton")
ARTIFACT_HELP = "the artifact folder that 'onnx-aot compile MODEL.onnx -o DIR' wrote"


def _count(text: str, least: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected a number >= {least}, got {value}")
    return value


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more milliseconds, got {text!r}")
    return value


def parse_autoscale(text: str) -> tuple[int, int]:
    """``MIN..MAX`` replicas (``0..4``)."""
    lo, sep, hi = text.partition("..")
    try:
        pair = (int(lo), int(hi))
    except ValueError:
        pair = (-1, -1)
    if not sep or not 0 <= pair[0] <= pair[1] or pair[1] < 1:
        raise argparse.ArgumentTypeError(f"expected MIN..MAX replicas (0 <= MIN <= MAX, MAX >= 1), "
                                         f"got {text!r}")
    return pair


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve an artifact on Ray Serve: HTTP (JSON or npz) and a Python "
                                     "handle, batching over its batch dim (needs the 'serve' extra)")
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("--port", type=lambda t: _count(t, 1), default=8000, help="HTTP port (default 8000)")
    p.add_argument("--route", default="/", metavar="/PATH", help="route prefix (default /)")
    p.add_argument("--address", default=None, metavar="RAY_ADDRESS",
                   help="join this Ray cluster (e.g. 10.0.0.1:6379 or auto) instead of starting Ray here")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--replicas", type=_count, default=1, metavar="N", help="replicas (default 1)")
    scale.add_argument("--autoscale", type=parse_autoscale, default=None, metavar="MIN..MAX",
                       help="let Ray scale the replicas between MIN and MAX")
    p.add_argument("--max-batch", type=_count, default=None, metavar="B",
                   help="most samples per run (default: the top of the artifact's batch range; 1: off)")
    p.add_argument("--batch-wait-ms", type=_milliseconds, default=5.0, metavar="T",
                   help="how long a run waits for more samples (default 5 ms)")
    p.add_argument("--threads", type=_count, default=None, metavar="N",
                   help="kernel threads per replica, as many Ray CPUs reserved (default: the cores "
                        "divided by the replicas, or by MAX when autoscaling; at least 1)")
    p.add_argument("--ingress", choices=("direct", "proxy"), default="direct",
                   help="direct (default): each replica also answers HTTP on its own port (listed on "
                        "stderr), without the proxy's hop; proxy: only Ray Serve's proxy on --port")
    p.add_argument("--verify", action="store_true",
                   help="each replica reruns the artifact's golden self-test before it serves")


def _add_export_triton(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-triton", help="write a Triton Inference Server Python-backend model "
                                             "repository entry for an artifact")
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("-o", "--output", required=True, metavar="MODEL_REPO",
                   help="the model repository folder (the model goes into MODEL_REPO/NAME)")
    p.add_argument("--name", default=None, help="the model's name (default: the artifact folder's)")
    p.add_argument("--max-batch", type=_count, default=None, metavar="B",
                   help="max_batch_size (default: the top of the artifact's batch range)")
    p.add_argument("--queue-delay-us", type=lambda t: _count(t, 0), default=5000, metavar="US",
                   help="dynamic_batching max_queue_delay_microseconds (default 5000)")
    p.add_argument("--instances", type=_count, default=1, metavar="N",
                   help="instance_group count (default 1)")


def add_serving_commands(sub: argparse._SubParsersAction) -> None:
    _add_serve(sub)
    _add_export_triton(sub)


def run_serving_command(args: argparse.Namespace) -> int:
    if args.command == "export-triton":
        from runtime.serving.triton import export_triton

        target = export_triton(args.artifact, args.output, name=args.name, max_batch=args.max_batch,
                               queue_delay_us=args.queue_delay_us, instances=args.instances)
        print(f"wrote {target} (config.pbtxt, 1/model.py, 1/artifact)")
        return 0
    return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    from runtime.serving.app import ServeSettings
    from runtime.serving.app import check_settings
    from runtime.serving.app import start
    from runtime.serving.app import stop

    settings = ServeSettings(args.artifact, port=args.port, route=args.route, address=args.address,
                             replicas=args.replicas, autoscale=args.autoscale, max_batch=args.max_batch,
                             batch_wait_ms=args.batch_wait_ms, threads=args.threads, verify=args.verify,
                             ingress=args.ingress)
    check_settings(settings)  # before Ray starts
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    served = previous = None
    try:
        served = start(settings)
        # after ray.init, which installs a SIGTERM handler of its own that ends the process
        previous = signal.signal(signal.SIGTERM, on_signal)
        print(f"serving {args.artifact} at {served.url}", flush=True)
        direct = served.replica_urls()
        if direct:
            print(f"replicas answering directly (no proxy hop): {' '.join(direct)}", file=sys.stderr,
                  flush=True)
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if served is not None:
            stop(served)
    print(f"stopped serving {args.artifact}", file=sys.stderr)
    return 0
