"""The ``aws`` provider: elastic agents on EC2 through boto3, tested against moto's
server.

An instance is tagged ``det:instance = det-instance-<row id>`` and launched with that name as
its ``ClientToken``, so EC2 itself answers a second launch of the same row with the instance
the first made, and a restarted reconciler finds it by its tag before it would launch again (a
reconciler killed between the launch and its record; moto ignores ClientToken, so its tests
rely on the tag). Its user data starts ``det agent run`` under that id; the
image carries det and what the agent needs to reach the database (``user_data`` may add
to the script, e.g. exporting ``DET_DB_URL``).
"""

from det.errors import DetError

LIVE_STATES = ["pending", "running", "stopping", "stopped"]


class ProviderError(DetError):
    """The provider refused (AWS: its error code and message), e.g. a quota or a wrong
    subnet."""


class AwsProvider:
    """Launches, finds and terminates the EC2 instances of one pool's ``provider`` config."""

    def __init__(self, pool: str, config: dict) -> None:
        """A client for ``pool``'s ``config`` (a ProviderConfig as stored).

        Raises:
            ProviderError: boto3 is not installed.
        """
        try:
            import boto3  # only a reconciler with an aws pool needs it
        except ImportError:
            raise ProviderError("AWS: boto3 is not installed (pip install 'det[aws]')") from None
        self.pool = pool
        self.config = config
        self.ec2 = boto3.client("ec2", region_name=config["region"],
                                endpoint_url=config.get("endpoint_url"))

    def running(self) -> dict[str, str]:
        """The pool's live instances: agent id -> EC2 instance id.

        Raises:
            ProviderError: EC2 refused.
        """
        found = {}
        pages = self._call(lambda: list(self.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag:det:pool", "Values": [self.pool]},
                     {"Name": "instance-state-name", "Values": LIVE_STATES}])))
        for page in pages:
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                    if "det:instance" in tags:
                        found[tags["det:instance"]] = inst["InstanceId"]
        return found

    def launch(self, agent_id: str, pool: str, slots: int) -> str:
        """Run one instance for ``agent_id`` (its ClientToken: launched once however often
        asked). Returns its EC2 instance id.

        Raises:
            ProviderError: EC2 refused (quota, capacity, auth, a wrong image or subnet).
        """
        c = self.config
        slot_args = f"--slots {slots} --slot-type {'auto' if slots else 'none'}"
        script = (f"#!/bin/sh\n{c.get('user_data', '')}\n"
                  f"exec det agent run --id {agent_id} --resource-pool {pool} {slot_args}\n")
        args = {"ImageId": c["image_id"], "InstanceType": c["instance_type"], "MinCount": 1,
                "MaxCount": 1, "ClientToken": agent_id, "UserData": script,
                "TagSpecifications": [{"ResourceType": "instance", "Tags": [
                    {"Key": "Name", "Value": agent_id}, {"Key": "det:instance", "Value": agent_id},
                    {"Key": "det:pool", "Value": pool}]}]}
        if c.get("subnet_id"):
            args["SubnetId"] = c["subnet_id"]
        if c.get("security_group_ids"):
            args["SecurityGroupIds"] = c["security_group_ids"]
        r = self._call(lambda: self.ec2.run_instances(**args))
        return r["Instances"][0]["InstanceId"]

    def stop(self, instance_id: str, kill: bool = False) -> None:
        """Terminate the instance (EC2 has no gentler stop that frees it; ``kill`` is the
        same).

        Raises:
            ProviderError: EC2 refused.
        """
        self._call(lambda: self.ec2.terminate_instances(InstanceIds=[instance_id]))

    @staticmethod
    def _call(fn):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn()
        except ClientError as e:
            err = e.response.get("Error", {})
            raise ProviderError(f"AWS: {err.get('Code')}: {err.get('Message')}") from None
        except BotoCoreError as e:
            raise ProviderError(f"AWS: {e}") from None
