"""xdist 3.8's scope scheduling (loadscope, loadgroup: ours) with its crash path fixed.

When a worker dies (a test that kills it, the OOM killer), xdist 3.8 reports the test it ran as failed
and starts a replacement, but its LoadScopeScheduling then hangs the run for ever (seen under
`make test` beside busy processes: "[gw1] node down: Not properly terminated", then both workers idle
and the controller waiting until killed):

- ``remove_node`` puts the dead worker's whole workload back on the queue, the scopes it had finished
  too; each is later sent as an empty ``runtests`` that never completes, and since a worker gets more
  work only when one of its tests completes, the run's tail waits for ever (pytest-xdist issues 1323,
  1378).
- A worker runs a test only once it has the next one (or is told to stop): a replacement given one
  scope of one test holds it for ever (issue 1327).
- The test the worker died in goes back on the queue and is run again, reported failed once more,
  and kills the replacement too if it killed the first (pull request 1371; LoadScheduling drops it).

Here only unfinished scopes go back, without the test the worker died in, and a worker given work
holds at least two tests or has been told to stop. (pytest-xdist has no release with the fixes.)
"""
from xdist.scheduler import LoadScopeScheduling


class CrashSafeScopes(LoadScopeScheduling):
    """LoadScopeScheduling whose runs end when a worker dies."""

    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        crashitem = None
        for scope, unit in workload.items():
            pending = [nodeid for nodeid, done in unit.items() if not done]
            if not pending:
                continue  # finished: not sent again
            if crashitem is None:  # the worker runs its scopes and their tests in order
                crashitem = pending[0]
                unit[crashitem] = True  # xdist reports it failed; not run again
                if len(pending) == 1:
                    continue
            self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node):
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 2:
            return
        self._assign_work_unit(node)
        while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
            self._assign_work_unit(node)
        if not self.workqueue:  # its last test runs once it knows there is none after it
            node.shutdown()
