"""``determined._info``: 0.38's module of ``ClusterInfo``; det's is
:mod:`det.harness.cluster_info`, which the Core API shares."""

from det.harness.cluster_info import ClusterInfo, TrialInfo, get_cluster_info, on_cluster

__all__ = ["ClusterInfo", "TrialInfo", "get_cluster_info", "on_cluster"]
