"""The full-kernel VM: Debian's kernel under qemu, for what this machine's kernel cannot do.

The host's kernel has no VRF, seg6local or bpffs; Debian's `linux-image-amd64` has all three.
`boot.run` boots it (one vCPU, emulation unless a stock kernel runs under this host's KVM),
with the host's root filesystem read-only under a tmpfs overlay so every path is the same as on
the host, runs one command, streams the console and returns the exit status (`VMResult`).
`image` builds and caches what it boots; `pytest_plugin` runs the ``fullkernel`` tests in it;
``python -m e2e.harness.vm run -- CMD`` is the same for a human.
"""

from .boot import VMResult, run
from .image import BootImage, ImageError, ensure_image, missing_tools

__all__ = ["BootImage", "ImageError", "VMResult", "ensure_image", "missing_tools",
           "run"]
