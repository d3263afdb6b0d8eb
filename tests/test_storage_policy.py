"""det serve reads a user's S3 checkpoint storage only where the cluster config allows and
never with its own credentials for a user's storage (issue 32). Before, a config with
`checkpoint_storage.endpoint_url: http://127.0.0.1:PORT` made det serve send signed requests
there, signed with det serve's own AWS credential chain when the config had no keys. The rule
(det.configs.storage_policy) as a pure function, the cluster config's new keys, and the
download route against a local listener that records every request it gets."""

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb
from test_api import Server, error

from det.configs.cluster import ClusterConfig, load_cluster_config
from det.configs.storage_policy import endpoint_key, storage_access
from det.errors import ConfigError, PermissionDeniedError

OWN = {"type": "s3", "bucket": "cluster-ckpts", "endpoint_url": "http://minio.internal:9000"}


def cluster(**extra) -> ClusterConfig:
    return ClusterConfig.model_validate(extra)


@pytest.mark.parametrize(("storage", "config", "ambient"), [
    # the cluster's own storage, however its URL is spelled: det serve's credentials
    (OWN, {"checkpoint_storage": OWN}, True),
    ({**OWN, "endpoint_url": "HTTP://Minio.Internal:9000/"}, {"checkpoint_storage": OWN}, True),
    ({**OWN, "endpoint_url": "http://minio.internal"},
     {"checkpoint_storage": {**OWN, "endpoint_url": "http://minio.internal:80"}}, True),
    # ... but a config with keys of its own uses them
    ({**OWN, "access_key": "k", "secret_key": "s"}, {"checkpoint_storage": OWN}, False),
    # AWS itself (no endpoint_url) and the cluster's own bucket there
    ({"type": "s3", "bucket": "b"}, {"checkpoint_storage": {"type": "s3", "bucket": "b"}}, True),
    # allowed by the list: the user's keys or none, never det serve's
    ({"type": "s3", "bucket": "team", "endpoint_url": "https://s3.example.com"},
     {"allowed_checkpoint_storage": {"endpoint_urls": ["https://s3.example.com:443"],
                                     "buckets": ["team"]}}, False),
    ({"type": "s3", "bucket": "cluster-ckpts"}, {"checkpoint_storage": OWN}, False),
    # files on det serve's host: outside this rule
    ({"type": "shared_fs", "host_path": "/srv/ckpts"}, {}, False),
    (None, {}, False),
])
def test_allowed_storage_and_whose_credentials(storage, config, ambient) -> None:
    assert storage_access(storage, cluster(**config)) is ambient


@pytest.mark.parametrize(("storage", "config", "message"), [
    # the attack of issue 32: a user's endpoint on det serve's loopback
    ({"type": "s3", "bucket": "b", "endpoint_url": "http://127.0.0.1:8080"}, {},
     "checkpoint_storage.endpoint_url: 'http://127.0.0.1:8080' is not one det serve may read "
     "checkpoints from (allowed: none; a ClusterAdmin adds one to the cluster config's "
     "allowed_checkpoint_storage.endpoint_urls)"),
    ({"type": "s3", "bucket": "cluster-ckpts", "endpoint_url": "http://169.254.169.254"},
     {"checkpoint_storage": OWN},
     "checkpoint_storage.endpoint_url: 'http://169.254.169.254' is not one det serve may read "
     "checkpoints from (allowed: 'http://minio.internal:9000';"),
    # user info before the allowed host's name: another host
    ({**OWN, "endpoint_url": "http://minio.internal:9000@127.0.0.1:9000"},
     {"checkpoint_storage": OWN}, "checkpoint_storage.endpoint_url: "),
    ({"type": "s3", "bucket": "someone-elses"}, {"checkpoint_storage": OWN},
     "checkpoint_storage.bucket: 'someone-elses' is not one det serve may read checkpoints "
     "from (allowed: 'cluster-ckpts';"),
    ({**OWN, "bucket": "other"}, {"checkpoint_storage": OWN}, "checkpoint_storage.bucket: "),
    # by default (no cluster storage, no list) det serve reads no S3 storage at all
    ({"type": "s3", "bucket": "b"}, {}, "checkpoint_storage.bucket: 'b' is not one det serve "
     "may read checkpoints from (allowed: none;"),
])
def test_other_storage_is_refused(storage, config, message) -> None:
    with pytest.raises(PermissionDeniedError) as info:
        storage_access(storage, cluster(**config))
    assert str(info.value).startswith(message), str(info.value)


def test_endpoint_key() -> None:
    assert endpoint_key("HTTPS://S3.Example.com/") == "https://s3.example.com:443"
    assert endpoint_key("http://h:9000/path/") == "http://h:9000/path"
    assert endpoint_key("http://u:p@h:1") == "http://u@h:1"


@pytest.mark.parametrize(("text", "message"), [
    ("checkpoint_storage: {type: s3, bucket: b, access_key: k, secret_key: s}\n",
     "cluster.yaml: checkpoint_storage: access_key and secret_key: not allowed here (every "
     "user may read the cluster config)"),
    ("allowed_checkpoint_storage: {endpoint_urls: ['file:///etc']}\n",
     "cluster.yaml: allowed_checkpoint_storage.endpoint_urls[0]: expected an http:// or "
     "https:// URL with a host, got 'file:///etc'"),
    ("allowed_checkpoint_storage: {endpoint_urls: ['http://u:p@h']}\n",
     "cluster.yaml: allowed_checkpoint_storage.endpoint_urls[0]: expected a URL without user"),
    ("allowed_checkpoint_storage: {buckets: ['']}\n",
     "cluster.yaml: allowed_checkpoint_storage.buckets[0]: "),
    ("allowed_checkpoint_storage: {hosts: []}\n",
     "cluster.yaml: allowed_checkpoint_storage: unknown key 'hosts'"),
])
def test_bad_storage_rules_in_the_cluster_config(text, message) -> None:
    with pytest.raises(ConfigError) as info:
        load_cluster_config(text, "cluster.yaml")
    assert str(info.value).startswith(message), str(info.value)


class Listener(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that records each request (method, path, headers) and
    answers S3's 404."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Record)
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _Record(http.server.BaseHTTPRequestHandler):
    def _any(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.command, self.path, dict(self.headers)))
        body = b"<Error><Code>NoSuchKey</Code><Message>not here</Message></Error>"
        self.send_response(404)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def listener() -> Iterator[Listener]:
    srv = Listener()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


# det serve's own credentials: what it must never lend a user's storage
SERVER_AWS = {"AWS_ACCESS_KEY_ID": "SERVERKEYID", "AWS_SECRET_ACCESS_KEY": "server-secret",
              "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

EXPERIMENT = """\
name: storage
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""


def checkpoint(conn, storage: dict) -> str:
    """A COMPLETED checkpoint of experiment 1 stored in ``storage``; returns its uuid."""
    return conn.execute("""
        WITH t AS (INSERT INTO trials (experiment_id, request_id, hparams, seed)
                   VALUES (1, gen_random_uuid(), '{}', 0) RETURNING id),
             a AS (INSERT INTO allocations (job_id, trial_id, run, resource_pool,
                                            slots_needed, spec)
                   SELECT e.job_id, t.id, 1, 'default', 1, '{}' FROM experiments e, t
                    WHERE e.id = 1 RETURNING id, trial_id)
        INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, storage)
        SELECT gen_random_uuid(), a.trial_id, a.id, 10, %s FROM a RETURNING uuid::text
        """, (Jsonb(storage),)).fetchone()["uuid"]


def authorizations(listener: Listener) -> list[str | None]:
    """The Authorization header of each request the listener got (None: unsigned)."""
    return [next((v for k, v in h.items() if k.lower() == "authorization"), None)
            for _, _, h in listener.seen]


def test_download_reads_only_allowed_storage_and_lends_no_credentials(
        det, det_env, conn, ctx, tmp_path: Path, listener: Listener) -> None:
    server = Server({**det_env, **SERVER_AWS}, tmp_path)
    try:
        (tmp_path / "e.yaml").write_text(EXPERIMENT)
        det("experiment", "create", str(tmp_path / "e.yaml"), str(ctx))
        user_storage = {"type": "s3", "bucket": "user-bucket", "endpoint_url": listener.url}
        uuid = checkpoint(conn, user_storage)

        # the attack: refused before a byte leaves det serve
        msg = error(server.client.get(f"/api/v1/checkpoints/{uuid}/download"), 403)
        assert msg.startswith(f"checkpoint_storage.endpoint_url: {listener.url!r} is not one "
                              "det serve may read checkpoints from (allowed: none;"), msg
        assert listener.seen == []

        # a ClusterAdmin allows the endpoint and the bucket: det serve asks, unsigned
        rules = tmp_path / "cluster.yaml"
        rules.write_text(f"allowed_checkpoint_storage: {{endpoint_urls: ['{listener.url}'], "
                         "buckets: [user-bucket]}\n")
        det("cluster", "config", "apply", str(rules))
        assert error(server.client.get(f"/api/v1/checkpoints/{uuid}/download"), 502) \
            .startswith(f"checkpoint {uuid} not found at s3://user-bucket/{uuid}")
        assert listener.seen and authorizations(listener) == [None] * len(listener.seen)

        # a config with keys of its own: signed with those
        listener.seen.clear()
        keyed = checkpoint(conn, {**user_storage, "access_key": "USERKEYID",
                                  "secret_key": "user-secret"})
        error(server.client.get(f"/api/v1/checkpoints/{keyed}/download"), 502)
        assert listener.seen and all("Credential=USERKEYID/" in (a or "")
                                     for a in authorizations(listener))

        # the cluster's own storage, and only it, gets det serve's own credentials
        listener.seen.clear()
        rules.write_text(f"checkpoint_storage: {{type: s3, bucket: user-bucket, "
                         f"endpoint_url: '{listener.url}'}}\n")
        det("cluster", "config", "apply", str(rules))
        error(server.client.get(f"/api/v1/checkpoints/{uuid}/download"), 502)
        assert listener.seen and all("Credential=SERVERKEYID/" in (a or "")
                                     for a in authorizations(listener))
        elsewhere = checkpoint(conn, {**user_storage, "bucket": "another"})
        listener.seen.clear()
        assert error(server.client.get(f"/api/v1/checkpoints/{elsewhere}/download"), 403) \
            .startswith("checkpoint_storage.bucket: 'another' is not one det serve may read")
        assert listener.seen == []
    finally:
        server.stop()
