"""Volumes as hostile input (the cluster file's `volumes`, `--volume`): a mount may not hide what the
image installed from the lock, may not name one container path twice under two spellings, and may not
carry what docker's `HOST:CONTAINER:MODE` bind strings would split differently. Each is one line, exit 2."""

from __future__ import annotations

import textwrap

import pytest

from envbuild.errors import InputError
from envrun.cluster.spec import ClusterFileError, parse_cluster_file
from envrun.plan import Volume


def cluster(volumes: str) -> str:
    return textwrap.dedent(f"""\
        name: glm5
        volumes: {volumes}
        nodes:
          - engine: unix:///var/run/docker.sock
        """)


@pytest.mark.parametrize(
    ("volumes", "words"),
    [
        ("[{host: /data, container: /}]", "would hide what the image installed from the lock"),
        ("[{host: /data, container: /opt}]", "would hide what the image installed from the lock"),
        ("[{host: /src, container: /opt/envbuild/src/megatron-lm}]", "would hide what the image installed"),
        ("[{host: /data, container: /opt/envbuild/}]", "would hide what the image installed"),
        ("[{host: /a, container: /data}, {host: /b, container: /data/}]", "/data is mounted twice"),
        ("[{host: /a, container: /data}, {host: /b, container: //data/.}]", "/data is mounted twice"),
        ("[{host: '/tmp/x:/etc', container: /data}]", "contains ':'"),
        ('[{host: "/data\\e[2J", container: /data}]', "control character"),
    ],
)
def test_a_hostile_volume_in_the_cluster_file_is_refused_in_one_line(volumes: str, words: str) -> None:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster_file(cluster(volumes), "cluster.yaml")
    message = str(info.value)
    assert words in message and "\x1b" not in message, message
    assert message.startswith("cluster.yaml:")


@pytest.mark.parametrize("text", ["/data:/opt/envbuild/src", "/data:/", "/data:/x:y:ro"])
def test_a_hostile_volume_flag_is_refused(text: str) -> None:
    with pytest.raises(InputError, match=r"^--volume "):
        Volume.parse(text)


def test_ordinary_volumes_still_pass() -> None:
    spec = parse_cluster_file(
        cluster(
            "[{host: /data, container: /data}, {host: /usr/local/Ascend/driver, container: /usr/local/Ascend/driver}]"
        )
    )
    assert [v.container for v in spec.volumes] == ["/data", "/usr/local/Ascend/driver"]
    assert Volume.parse("/scratch:/runs:rw").mode == "rw"
