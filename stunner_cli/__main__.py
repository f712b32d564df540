"""`stunner` (and `helm stunner`): STUNner's command line for cluster operators.

    stunner config [NS/GW] [-o summary|json|yaml] [--show-secrets] [-w]
    stunner status [NS/GW]
    stunner ice [NS/GW] [--ttl S] [--username U]
    stunner render -f DIR|FILE
    stunner check -f DIR|FILE
    stunner diff -f DIR|FILE [NS/GW]
    stunner explain NS/GW PEER[:PORT] [-f DIR|FILE]   (why a peer is admitted or refused)
    stunner selftest --cds-url URL [--peer|--echo IP:PORT] [--gateway NS/GW]  (`helm test`)
    stunner auth-server --cds-url URL [--port 8088]     (the chart's auth/ICE service)
    stunner webhook-ready [-n NS] [--timeout S]   (the chart's post-install hook: waits until
                                                   the webhook judges a dry-run create)

Exit codes: 0 done, 1 the cluster or the input has a problem (said on stderr), 2 bad usage;
`explain`: 0 some listener admits the peer, 1 every listener refuses it.
Run as a helm plugin it honours HELM_NAMESPACE, HELM_KUBECONTEXT and --kubeconfig.

Here is only the dispatch: the arguments and each subcommand's runner are stunner_cli.parser's
(one table), the runs are in stunner_cli.commands (explain's words: stunner_cli.explain), and
what they print in stunner_cli.output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from stunner_cli.output import FAILED, OK, err
from stunner_cli.parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        run: Callable[[argparse.Namespace], int] = args.run
        return run(args)
    except KeyboardInterrupt:
        return OK
    except Exception as e:
        from stunner_cli.kube import ClusterError

        if isinstance(e, ClusterError):
            err(str(e))
            return FAILED
        raise


if __name__ == "__main__":
    sys.exit(main())
