"""The servers inside interactive tasks: ``python -m det.harness.interactive KIND``.

``AllocationSpec.argv`` runs it for a notebook, shell or TensorBoard task. It reads its identity
from the environment the agent sets (``DET_DB_URL``, ``DET_ALLOCATION_ID``,
``DET_ALLOCATION_TOKEN``, ``DET_JOB_ID``, and ``DET_TASK_SPEC``: the spec's ``task`` as JSON)
and talks to the database through the harness's transport (det's one retry layer), with the
allocation token's functions only. Then:

1. it gets the task's secrets (``det_task.secrets``), picks a free port on this host (host
   networking under docker too) and starts the server on it, bound to the address it reports
   (:func:`det.agent.gang.host_address`):

   - ``notebook``: JupyterLab (:mod:`.notebook`), at base URL ``/proxy/<job id>/``, with the
     task's random Jupyter token (det serve's proxy injects it), in ``work_dir`` or the task's
     directory;
   - ``tensorboard``: TensorBoard (:mod:`.tensorboard`) with path prefix ``/proxy/<job id>``,
     over the event files of the chosen experiments and trials
     (``det_task.tensorboard_sources``);
   - ``shell``: OpenSSH's ``sshd`` (:mod:`.shell`), unprivileged: a host key made for the task,
     the task's public key as the only authorised key. The login user is the task process's
     own user (root in det's image; the agent's user under the process runtime), so its
     address is ``user@host:port``;

2. it waits until the server answers (HTTP for JupyterLab and TensorBoard, sshd's banner) and
   records the address (``det_task.ready``); a server that exits first, or does not answer
   within :data:`.common.START_TIMEOUT_SECONDS`, ends the task with a nonzero exit and a
   one-line reason;
3. every :data:`.common.ACTIVITY_POLL_SECONDS` it reads the server's own view of its use and
   reports the latest sign of it (``det_task.activity``): a notebook by its
   ``notebook_idle_type`` from Jupyter's ``/api/kernels`` and ``/api/terminals``, a shell by
   its open SSH sessions, a TensorBoard never (det serve's proxy reports its traffic). The
   reconciler decides idleness from ``tasks.last_activity``;
4. it exits when the server exits (with its code), and stops the server (SIGTERM, then
   SIGKILL after :data:`.common.STOP_GRACE_SECONDS`) on SIGTERM or once the run is to stop
   (``det_task.should_preempt``), exiting 0.
"""
