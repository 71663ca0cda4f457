"""Stages link and select_device_events: which Kineto events the host ops are, and which Kineto events belong
to the conversion.

- `host.py`: host ET ops to Kineto cpu events (by `Record function id`, else by aligning each thread's op sequence),
  the window of the linked events, and the evidence that two files are not of one run and rank.
- `kineto_ops.py`: Kineto cpu ops as host ops: all of them when there is no host ET, else those of the linked
  window that no host op stands for. New ops in a list of their own; the reader's `HostTrace` is never changed.
- `window.py`: the `--steps` / `--window` selection of a Kineto trace.
- `device.py`: the runtime calls and GPU events of the window, and what was left out, why.
"""

from etweave.link.device import DeviceSelection, LeftOut, select_device
from etweave.link.host import HostLink, link_host, mismatch_evidence
from etweave.link.kineto_ops import add_unlinked_cpu_ops, kineto_host
from etweave.link.window import Selection, Window, restrict

__all__ = ["DeviceSelection", "HostLink", "LeftOut", "Selection", "Window", "add_unlinked_cpu_ops",
           "kineto_host", "link_host", "mismatch_evidence", "restrict", "select_device"]
