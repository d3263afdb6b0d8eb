"""det.agent: the per-host daemon.

It registers the host's slots (:mod:`det.agent.devices`), heartbeats on a thread of its own
(:mod:`det.agent.heartbeat`), waits for its assignments (LISTEN on its channel plus polling)
and reconciles them against the tasks it runs (:mod:`det.agent.daemon`), launching each
through a runtime (:mod:`det.agent.process`, :mod:`det.agent.containers`) whose output goes to
the task logs table (:mod:`det.agent.logs`).
"""
