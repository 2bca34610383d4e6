"""The Parquet results store: local directory and a real S3-compatible server on loopback."""

import socket

import pyarrow.fs as pafs
import pytest

from gauntlet.steps.evidence.results import append_rounds, read_rounds


def _row(**kw):
    base = dict(run_id="r1", profile="local-cpu", engine="vllm", date="2026-12-02", client="vllm-bench-serve",
                case="c2-128-32", concurrency=2, round=1, valid=True, output_throughput=50.0, p99_ttft_ms=300.0,
                image_digest="sha256:" + "0" * 64, args_hash="abc", git_rev="deadbeef", model_fingerprint="fp")
    base.update(kw)
    return base


def test_local_round_trip_partitioned(tmp_path):
    rows = [_row(round=i, output_throughput=50.0 + i) for i in range(1, 4)]
    assert append_rounds(rows, tmp_path) == {"rounds": 3}
    append_rounds([_row(engine="sglang", date="2026-12-03")], tmp_path)
    parts = sorted(p.relative_to(tmp_path).parts[:4] for p in tmp_path.rglob("*.parquet"))
    assert ("rounds", "profile=local-cpu", "engine=vllm", "date=2026-12-02") in parts
    assert ("rounds", "profile=local-cpu", "engine=sglang", "date=2026-12-03") in parts
    t = read_rounds(tmp_path, engine="vllm")
    assert sorted(t.column("output_throughput").to_pylist()) == [51.0, 52.0, 53.0]
    assert set(t.column("git_rev").to_pylist()) == {"deadbeef"}
    assert read_rounds(tmp_path).num_rows == 4


def test_other_clients_are_stored_apart(tmp_path):
    append_rounds([_row(), _row(client="sglang-bench-serving", output_throughput=999.0)], tmp_path)
    main = read_rounds(tmp_path)
    assert main.column("output_throughput").to_pylist() == [50.0]
    diag = read_rounds(tmp_path, table="diagnostics")
    assert diag.column("client").to_pylist() == ["sglang-bench-serving"]


def test_empty_store_reads_empty(tmp_path):
    assert read_rounds(tmp_path / "none").num_rows == 0


def test_row_without_partition_is_refused(tmp_path):
    with pytest.raises(ValueError, match="partition"):
        append_rounds([_row(engine=None)], tmp_path)


@pytest.fixture
def s3_server(monkeypatch):
    moto_server = pytest.importorskip("moto.server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    endpoint = f"127.0.0.1:{port}"
    fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1",
                           access_key="testing", secret_key="testing", allow_bucket_creation=True)
    fs.create_dir("gauntlet-results")
    yield f"s3://gauntlet-results/kimi-k3?endpoint_override={endpoint}&scheme=http&region=us-east-1", fs
    server.stop()


def test_s3_round_trip(s3_server):
    uri, fs = s3_server
    append_rounds([_row(round=i) for i in range(1, 4)], uri)
    append_rounds([_row(date="2026-12-03", output_throughput=45.0)], uri)
    files = fs.get_file_info(pafs.FileSelector("gauntlet-results/kimi-k3/rounds", recursive=True))
    keys = [f.path for f in files if f.type == pafs.FileType.File]
    assert len(keys) == 2 and all("/profile=local-cpu/engine=vllm/date=" in k for k in keys)
    t = read_rounds(uri, profile="local-cpu")
    assert t.num_rows == 4 and sorted(set(t.column("date").to_pylist())) == ["2026-12-02", "2026-12-03"]


def test_a_store_uri_pyarrow_cannot_open_is_a_usage_error():
    from gauntlet.contract import UsageError
    with pytest.raises(UsageError, match="results store 'nosuch://x/y'"):
        read_rounds("nosuch://x/y")


def test_s3_a_corrupt_object_is_quarantined_and_the_rest_reads(s3_server):
    from gauntlet.steps.evidence.results import load_rounds
    uri, fs = s3_server
    uri = uri.replace("/kimi-k3?", "/corrupt?")      # moto keeps the other test's objects: a prefix of its own
    append_rounds([_row(round=i) for i in range(1, 4)], uri)
    append_rounds([_row(date="2026-12-03")], uri)
    files = fs.get_file_info(pafs.FileSelector("gauntlet-results/corrupt/rounds", recursive=True))
    victim = next(f.path for f in files if f.type == pafs.FileType.File and "date=2026-12-03" in f.path)
    with fs.open_output_stream(victim) as fh:
        fh.write(b"PAR1 and then nothing")
    got = load_rounds(uri, profile="local-cpu")
    assert got.table.num_rows == 3 and [q.moved_to for q in got.quarantined] == \
        ["quarantine/" + victim.split("corrupt/", 1)[1]]
    assert fs.get_file_info("gauntlet-results/corrupt/" + got.quarantined[0].moved_to).type == pafs.FileType.File
    assert load_rounds(uri).quarantined == () and read_rounds(uri).num_rows == 3
    staged = fs.get_file_info(pafs.FileSelector("gauntlet-results/corrupt/_staging", recursive=True,
                                                allow_not_found=True))
    assert [f.path for f in staged if f.type == pafs.FileType.File] == []
