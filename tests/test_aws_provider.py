"""The aws provider against moto's EC2 (issue 36): each instance's agent enrolls with a token
made for it alone, given in its user data, and a spot launch EC2 has no capacity for is
launched on demand.

moto's server runs no VM: the user data an instance got is read back from EC2 and run here,
as the instance would run it at boot.
"""

import base64
import os
import subprocess
from pathlib import Path

import boto3
import pytest
from conftest import REPO, wait_for
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from test_checkpoint_storage import s3_server  # noqa: F401 (moto's server, EC2 included)

from det.configs.cluster import ProviderConfig
from det.errors import ConfigError
from det.reconciler.aws_provider import SPOT_CAPACITY_ERRORS, AwsProvider, ProviderError


def _master(db_url: str) -> str:
    """The test database's URL without its login, as a pool's master_url names it."""
    return make_conninfo(**{k: v for k, v in conninfo_to_dict(db_url).items()
                            if k not in ("user", "password", "passfile")})


@pytest.fixture
def aws(s3_server, db_url, conn, monkeypatch):  # noqa: F811 (the fixture)
    """A pool "elastic" and the provider of its aws config (moto's EC2, the test database as
    the reconciler's DET_DB_URL and as the instances' master_url)."""
    monkeypatch.setenv("DET_DB_URL", db_url)
    conn.execute("INSERT INTO resource_pools (name) VALUES ('elastic')")
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=s3_server)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]

    def provider(**extra) -> AwsProvider:
        config = ProviderConfig(**{"type": "aws", "endpoint_url": s3_server, "image_id": ami,
                                   "master_url": _master(db_url),
                                   "agent_startup_timeout": "3m", **extra})
        return AwsProvider("elastic", config.model_dump(mode="json"))
    return ec2, provider


def _instance(ec2, instance_id: str) -> dict:
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]


def _user_data(ec2, instance_id: str) -> str:
    attr = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(attr["UserData"]["Value"]).decode()


def test_each_instance_enrolls_its_agent_with_a_token_of_its_own(aws, conn, det_env,
                                                                  tmp_path) -> None:
    ec2, provider = aws
    p = provider(user_data="echo provisioned > \"$DET_HOME/marker\"")
    ids = [p.launch(f"aws-instance-{i}", "elastic", 1) for i in (1, 2)]
    scripts = [_user_data(ec2, i) for i in ids]
    tokens = [s.split("DET_ENROLL_TOKEN=")[1].split()[0] for s in scripts]
    assert tokens[0] != tokens[1] and all(t.startswith("det_enroll_") for t in tokens)
    # one token per instance, in its pool, good for the pool's startup timeout
    rows = conn.execute("SELECT role_name, resource_pool, expires_at - created_at AS life "
                        "FROM agent_enrollment_tokens ORDER BY created_at").fetchall()
    assert [r["role_name"] for r in rows] == [t.split(".")[0] for t in tokens]
    assert {(r["resource_pool"], r["life"].total_seconds()) for r in rows} == {("elastic", 180)}
    assert "password" not in scripts[0] and "det_agent:" not in scripts[0]
    # The first instance boots: its user data enrolls the agent and starts it, as its own login.
    home = tmp_path / "instance-home"
    home.mkdir()
    env = {k: v for k, v in det_env.items() if k != "DET_DB_URL"}
    env.update(DET_HOME=str(home), PATH=f"{Path(os.sys.executable).parent}:{env['PATH']}")
    log = open(tmp_path / "instance.log", "wb")  # noqa: SIM115 (closed below)
    boot = subprocess.Popen(["sh", "-c", scripts[0]], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: conn.execute(
            "SELECT 1 FROM agents WHERE id = 'aws-instance-1'").fetchone()
            or boot.poll() is not None, 120, "the instance's agent to log in")
        row = conn.execute("SELECT resource_pool FROM agents WHERE id = 'aws-instance-1'"
                           ).fetchone()
        assert row == {"resource_pool": "elastic"}, (tmp_path / "instance.log").read_text()
        logins = {r["usename"] for r in conn.execute(
            "SELECT usename FROM pg_stat_activity WHERE usename LIKE 'det\\_agent%%'")}
        assert logins == {"det_agent_aws-instance-1"}  # its own login, not det_agent's
    finally:
        boot.terminate()
        boot.wait(60)
        log.close()
    assert (home / "marker").read_text() == "provisioned\n"  # the pool's user_data ran first
    # the token is used up: a second boot of the same user data cannot enroll again
    used = subprocess.run(["sh", "-c", scripts[0].replace("exec det agent run", "echo")],
                          cwd=REPO, env={**env, "DET_HOME": str(tmp_path / "again")},
                          capture_output=True, text=True, timeout=120)
    assert used.returncode == 1 and "--token: already used" in used.stderr


def test_an_instance_is_given_dets_ca_where_master_url_verifies_with_it(
        aws, tmp_path, monkeypatch) -> None:
    """With det's TLS gateway (a CA in the reconciler's det home) and a master_url whose
    sslrootcert names a path, the user data writes the CA certificate there before anything
    else runs; without sslrootcert it writes none."""
    from det.db import tls

    ec2, provider = aws
    home = tmp_path / "reconciler-home"
    monkeypatch.setenv("DET_HOME", str(home))
    tls.tls_dir(home).mkdir(parents=True)
    tls.ensure_ca(home)
    root = tmp_path / "instance" / "etc" / "det ca.crt"  # a directory to make, a space to quote
    p = provider(master_url=f"host=db.example dbname=det sslmode=verify-full sslrootcert='{root}'")
    script = _user_data(ec2, p.launch("aws-instance-7", "elastic", 1))
    head = script.split("DET_ENROLL_TOKEN=")[0]  # what runs before the enrollment
    subprocess.run(["sh", "-c", head], check=True, timeout=30)
    assert root.read_text().strip() == tls.ca_cert_path(home).read_text().strip()
    assert "PRIVATE KEY" not in script
    plain = provider().launch("aws-instance-8", "elastic", 1)
    assert "BEGIN CERTIFICATE" not in _user_data(ec2, plain)


def _refuse_spot(provider: AwsProvider, code: str) -> list[dict]:
    """Fault injection: EC2 answers each spot RunInstances with ``code`` (botocore's
    before-call hook answers in its place); returns the requests made (their query
    parameters), spot or not."""
    asked: list[dict] = []

    def answer(params, **_):
        asked.append(params["body"])
        if "InstanceMarketOptions.MarketType" not in params["body"]:
            return None  # on demand: moto's EC2 answers

        class Refused:
            status_code = 500

        return Refused(), {"Error": {"Code": code, "Message": f"injected {code}"}}

    provider.ec2.meta.events.register("before-call.ec2.RunInstances", answer)
    return asked


def test_spot_without_capacity_launches_the_same_instance_on_demand(aws) -> None:
    ec2, provider = aws
    p = provider(spot=True)
    spot = _instance(ec2, p.launch("aws-instance-1", "elastic", 1))
    assert spot.get("InstanceLifecycle") == "spot"
    asked = _refuse_spot(p, "InsufficientInstanceCapacity")
    fallback = _instance(ec2, p.launch("aws-instance-2", "elastic", 1))
    assert "InstanceLifecycle" not in fallback
    assert [("InstanceMarketOptions.MarketType" in a, a["ClientToken"]) for a in asked] == [
        (True, "aws-instance-2"), (False, "aws-instance-2-on-demand")]
    assert asked[0]["UserData"] == asked[1]["UserData"]  # the same instance, one token
    assert p.running() == {"aws-instance-1": spot["InstanceId"],
                           "aws-instance-2": fallback["InstanceId"]}
    assert "InsufficientInstanceCapacity" in SPOT_CAPACITY_ERRORS
    # Any other refusal is no want of spot capacity: it fails as it would on demand.
    p2 = provider(spot=True)
    asked = _refuse_spot(p2, "UnauthorizedOperation")
    with pytest.raises(ProviderError, match="AWS: UnauthorizedOperation: injected"):
        p2.launch("aws-instance-3", "elastic", 1)
    assert len(asked) == 1


def test_an_aws_pool_needs_a_master_url_without_a_login() -> None:
    from det.configs.cluster import load_cluster_config

    base = "resource_pools: [{name: default, provider: {type: aws, image_id: ami-1%s}}]"
    for extra, message in (
            ("", "master_url: required for type aws"),
            (", master_url: 'postgresql://det_agent:pw@db/det'", "master_url: no user or password"),
            (", master_url: 'host=db dbname'", "master_url: not a database URL")):
        with pytest.raises(ConfigError, match=message):
            load_cluster_config(base % extra)
    with pytest.raises(ConfigError, match="spot: only for type aws, not local"):
        load_cluster_config("resource_pools: [{name: e, provider: {type: local, spot: true}}]")
