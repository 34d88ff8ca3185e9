"""make demo: the local control plane with both operators and sample objects, and what people see.

Until the operators land it starts the control plane, shows that it answers, and says what is missing.
It ends cleanly on Ctrl-C and leaves nothing running.
"""

from __future__ import annotations

import signal
import subprocess
import threading

from hack.devcluster import LocalControlPlane


def main() -> None:
    with LocalControlPlane() as cluster:
        print(f"local control plane ready in {cluster.ready_seconds:.1f}s at {cluster.server}")
        subprocess.run([cluster.kubectl, "--kubeconfig", cluster.kubeconfig, "get", "namespaces"], check=True)
        print()
        print("The operators have not landed yet, so there is nothing more to show.")
        print(f"Try it yourself:  export KUBECONFIG={cluster.kubeconfig}; {cluster.kubectl} get nodes")
        print("Press Ctrl-C to stop the control plane.")
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        stop.wait()
    print("stopped; nothing left running")


if __name__ == "__main__":
    main()
