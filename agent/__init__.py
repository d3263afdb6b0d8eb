"""det.agent: the per-host daemon.

It registers the host's slots (:mod:`det.agent.devices`), heartbeats, waits for its
assignments (LISTEN ``agent_<id>`` plus polling) and reconciles them against the tasks it runs
(:mod:`det.agent.daemon`), launching each as a process (:mod:`det.agent.process`) whose output
goes to the task logs table (:mod:`det.agent.logs`).
"""
