"""The ``aws`` provider: elastic agents on EC2 through boto3, tested against moto's
server.

An instance is tagged ``det:instance = det-instance-<row id>`` and launched with that name as
its ``ClientToken``, so EC2 itself answers a second launch of the same row with the instance
the first made, and a restarted reconciler finds it by its tag before it would launch again (a
reconciler killed between the launch and its record; moto ignores ClientToken, so its tests
rely on the tag). Its user data enrolls the agent under that id with a one-time token made
for that instance alone (``det agent enroll --master <master_url>``: the instance gets a login
of its own, no shared password), then starts ``det agent run``; the image carries det, and
``user_data``, run first, may add what else the host needs. Where ``master_url`` verifies
the server with a ``sslrootcert`` path, the user data first writes det's CA certificate (the
reconciler's ``det cluster ca``: public, no key) at that path, so an instance of a stock
image trusts det's TLS gateway. The token expires after the pool's
``agent_startup_timeout``, past which the instance is given up anyway.

With ``spot: true`` an instance is asked for on the spot market; where EC2 has no spot
capacity for it (:data:`SPOT_CAPACITY_ERRORS`), the same instance is launched on demand.
"""

import shlex

from psycopg.conninfo import conninfo_to_dict

from det.db.reconnect import CALL_DEADLINE_SECONDS
from det.errors import DetError
from det.sql import named

Q = named("aws")

LIVE_STATES = ["pending", "running", "stopping", "stopped"]

SPOT_CAPACITY_ERRORS = frozenset({"InsufficientInstanceCapacity", "SpotMaxPriceTooLow",
                                  "MaxSpotInstanceCountExceeded", "UnfulfillableCapacity"})
"""EC2's error codes (its API reference, "Error codes") for a spot request it cannot fill
now, which an on-demand launch of the same instance may: no capacity of the type in the
zone, a spot price above the maximum, the account's spot limit. Others (quota, auth, a wrong
image or subnet) would fail on demand as well."""

TOKEN_ROLE = "det_enroll_"
"""The prefix of an enrollment token's role (``det_user.agent_token_create`` names it)."""

MAX_TOKEN_SECONDS = 7 * 24 * 3600
"""The longest an enrollment token may live (``det_user.agent_token_create``)."""


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
        asked), its user data enrolling the agent with a token of its own
        (:func:`enrollment_token`, on a connection of its own to ``DET_DB_URL``'s database,
        the reconciler's); on the spot market with ``spot``, on demand where spot has no
        capacity. Returns its EC2 instance id.

        Raises:
            ProviderError: EC2 refused (quota, capacity, auth, a wrong image or subnet).
            det.errors.DatabaseError: the database could not be reached for the token.
        """
        from det.db import connect, owner_url

        c = self.config
        seconds = min(int(c.get("agent_startup_timeout", 600)), MAX_TOKEN_SECONDS)
        with connect(owner_url(), autocommit=True, deadline=CALL_DEADLINE_SECONDS) as conn:
            token = enrollment_token(conn, pool, seconds)
        script = user_data(c.get("user_data", ""), c["master_url"], token, agent_id, pool,
                           slots, _ca_pem())
        args = {"ImageId": c["image_id"], "InstanceType": c["instance_type"], "MinCount": 1,
                "MaxCount": 1, "ClientToken": agent_id, "UserData": script,
                "TagSpecifications": [{"ResourceType": "instance", "Tags": [
                    {"Key": "Name", "Value": agent_id}, {"Key": "det:instance", "Value": agent_id},
                    {"Key": "det:pool", "Value": pool}]}]}
        if c.get("subnet_id"):
            args["SubnetId"] = c["subnet_id"]
        if c.get("security_group_ids"):
            args["SecurityGroupIds"] = c["security_group_ids"]
        if not c.get("spot"):
            return self._run(args)
        spot = {**args, "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}}
        try:
            return self._run(spot)
        except SpotUnavailable as e:
            # Another ClientToken: EC2 would answer the spot request's own with its failure.
            return self._run({**args, "ClientToken": f"{agent_id}-on-demand"}, str(e))

    def _run(self, args: dict, fallback_from: str | None = None) -> str:
        """``run_instances(**args)``'s instance id; ``fallback_from``: the spot refusal this
        on-demand launch replaces (kept in the error should it fail too).

        Raises:
            SpotUnavailable: a spot request EC2 has no capacity for.
            ProviderError: any other refusal.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            r = self.ec2.run_instances(**args)
        except BotoCoreError as e:
            raise ProviderError(f"AWS: {e}") from None
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if "InstanceMarketOptions" in args and code in SPOT_CAPACITY_ERRORS:
                raise SpotUnavailable(_message(e)) from None
            if fallback_from is not None:
                raise ProviderError(f"{_message(e)} (on demand, after spot: "
                                    f"{fallback_from})") from None
            raise ProviderError(_message(e)) from None
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
            raise ProviderError(_message(e)) from None
        except BotoCoreError as e:
            raise ProviderError(f"AWS: {e}") from None


class SpotUnavailable(ProviderError):
    """EC2 has no spot capacity for the instance now (:data:`SPOT_CAPACITY_ERRORS`)."""


def _message(e) -> str:
    err = e.response.get("Error", {})
    return f"AWS: {err.get('Code')}: {err.get('Message')}"


def enrollment_token(conn, pool: str, seconds: int) -> str:
    """A one-time enrollment token for one agent of ``pool``, good for ``seconds``
    (``det_user.agent_token_create`` on ``conn``, a ClusterAdmin's or the cluster's own session,
    with dict rows),
    as `det agent token create` prints it: ``<role>.<secret>``; the secret reaches the
    server only as a SCRAM verifier.

    Raises:
        psycopg.Error: the database refused (e.g. an unknown pool).
    """
    from det.db import passfile, roles

    secret = passfile.new_password()
    ver = roles.verifier(conn, TOKEN_ROLE, secret, iterations=roles.MACHINE_SCRAM_ITERATIONS)
    row = conn.execute(Q.enrollment_token, (ver, pool, f"{seconds} seconds")).fetchone()
    return f"{row['role_name']}.{secret}"


def _ca_pem() -> str | None:
    """det's CA certificate (PEM) where this det home has one (``det cluster up --listen``)."""
    from det.db import det_home, tls

    path = tls.ca_cert_path(det_home())
    return path.read_text() if path.is_file() else None


def user_data(extra: str, master_url: str, token: str, agent_id: str, pool: str,
              slots: int, ca_pem: str | None = None) -> str:
    """The instance's user data: a shell script that writes ``ca_pem`` (det's CA certificate)
    at the path ``master_url``'s ``sslrootcert`` names (where it names one), runs ``extra``
    (the pool's ``user_data``), enrolls the agent as ``agent_id`` at ``master_url`` with
    ``token`` (given through the environment, as ``--token``'s DET_ENROLL_TOKEN, not on a
    command line other users of the host see), then, once enrolled, runs it with ``slots``
    slots in ``pool``."""
    slot_args = f"--slots {slots} --slot-type {'auto' if slots else 'none'}"
    root = conninfo_to_dict(master_url).get("sslrootcert")
    ca = ""
    if ca_pem and root:
        path = shlex.quote(root)
        ca = (f"mkdir -p \"$(dirname {path})\" && cat > {path} <<'DET_CA_PEM'\n"
              f"{ca_pem.rstrip()}\nDET_CA_PEM\n")
    return (f"#!/bin/sh\n{ca}{extra}\n"
            f"DET_ENROLL_TOKEN={shlex.quote(token)} det agent enroll "
            f"--master {shlex.quote(master_url)} --id {agent_id} &&\n"
            f"exec det agent run --id {agent_id} --resource-pool {pool} {slot_args}\n")
