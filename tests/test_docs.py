"""Every fenced code block of README.md and docs/**/*.md, executed (issue 14), so that a
docs example cannot break silently.

- ```python: run in a fresh interpreter, in a temp dir, against this session's servers:
  the addresses the docs show are rewritten to them (`REWRITES`), and so is any
  `locks.toml` the block reads (the page's last ```toml with `[backends]` before it, else
  the repository's examples/locks.toml) or repository file it names (compose/locks.toml).
  Names the docs use without defining them come from `STUBS`.
- ```sh / bash / console: each command by its kind (`COMMANDS`): `locks` and `python` are
  run through the real entry point and must exit as documented (0 unless the command's
  comment says `# exits N`); installs and builds are not run, only checked where a cheap
  check can fail (an extra, a make target, a file), and commands that start or administer
  the reader's own servers are checked likewise and reported as not run.
- ```toml: loaded by `locks.from_config` (no I/O) when it has `[backends]`, else parsed.
- A block that needs a server this session does not start (`UNAVAILABLE`, recognised by
  its addresses) is skipped naming it; so is a block marked `<!-- not run: REASON -->` on
  the line before its fence, and any block in another language.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from locks import from_config

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/**/*.md")
DEFAULT_CONFIG = "examples/locks.toml"  # the config the docs send readers to
LOCKS = str(Path(sys.executable).with_name("locks"))  # the installed entry point
TIMEOUT = 60.0  # seconds for one block's program or command
REDIS_DB = 13  # the docs' own database on the session's redis-servers, emptied per block

# what a block needs that this session does not start, recognised by its content
UNAVAILABLE = {
    "Redis Sentinel": r"redis\+sentinel://|\bSentinel\(|\bsentinels\s*=",
    "a Redis Cluster": r"redis\+cluster://|\bRedisCluster\b|\bcluster_nodes\s*=",
    "a ZooKeeper ensemble": r"[\w.-]+:\d+,[\w.-]+:2181|[\w.-]+:2181,[\w.-]+:\d+",
    "a MariaDB replica": r"mariadb-replica|compose/replica\.yml|@[\w.-]+:3307\b",
}

# names the docs use for brevity without defining them: injected only into a block that
# uses the name and does not define it (the provider's address is rewritten like any)
STUBS = {
    "provider": "from locks.backends import RedisHashProvider\n\n"
    'provider = RedisHashProvider("redis://127.0.0.1:6379/0")\n',
    "save_order": "def save_order(order_id, fence):\n    print('saved', order_id, fence)\n",
    "write": "def write(chunk, fence):\n    print('wrote', chunk, fence)\n",
    "chunks": "chunks = ['first', 'second']\n",
    "cancelled": "import threading\n\ncancelled = threading.Event()\n",
}


# -- the blocks --------------------------------------------------------------------------

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*).*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # the opening fence's, 1-based
    lang: str
    text: str
    not_run: str | None  # the reason a `<!-- not run: ... -->` gives
    config: str | None  # the page's last ```toml block with [backends] before this one

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def page_blocks(page: Path) -> Iterator[Block]:
    lines = page.read_text().splitlines()
    config: str | None = None
    at = 0
    while at < len(lines):
        opening = FENCE.match(lines[at])
        if opening is None:
            at += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = at + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        body = [line.removeprefix(indent) for line in lines[at + 1 : end]]
        text = "\n".join(body) + "\n"
        marker = NOT_RUN.match(lines[at - 1]) if at else None
        lang = opening["lang"].lower()
        yield Block(
            page=page.relative_to(ROOT).as_posix(),
            line=at + 1,
            lang=lang,
            text=text,
            not_run=marker["reason"] if marker else None,
            config=config,
        )
        if lang == "toml" and re.search(r"^\[backends[].]", text, re.MULTILINE):
            config = text
        at = end + 1


def all_blocks() -> list[Block]:
    pages = sorted({path for pattern in PAGES for path in ROOT.glob(pattern)})
    return [block for page in pages for block in page_blocks(page)]


BLOCKS = all_blocks()


# -- the session's servers, and the docs' addresses rewritten to them ---------------------


@dataclass
class Servers:
    """The session's servers a block needs, started on demand through their fixtures."""

    request: pytest.FixtureRequest
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)  # secrets the rewritten text names
    redis_urls: list[str] = field(default_factory=list)  # every one the block was given
    redis_given: dict[str, str] = field(default_factory=dict)  # the docs' -> the session's
    pg_table: bool = False  # the lock table made on the session's PostgreSQL

    def _fixture(self, name: str) -> Any:
        return self.request.getfixturevalue(name)

    def _redis(self, server: Any) -> str:
        url = f"redis://{server.address}/{REDIS_DB}"
        if url not in self.redis_urls:
            import redis  # noqa: PLC0415 - only blocks on Redis need it

            with redis.Redis.from_url(url) as client:
                client.flushdb()  # what an earlier block left held is not this one's
            self.redis_urls.append(url)
        return url

    def redis(self, found: re.Match[str]) -> str:
        """Each distinct server the docs name is a distinct one of the session's."""
        address = found["redis"]
        if address not in self.redis_given:
            servers = [self._fixture("redis_server")]
            if self.redis_given:  # several: a quorum's independent servers
                servers = self._fixture("redis_masters").servers
            self.redis_given[address] = self._redis(servers[len(self.redis_given)])
        return self.redis_given[address]

    def redis_template(self, found: re.Match[str]) -> str:
        """A URL built at run time (`f"redis://10.0.0.{i}:6379/0"`): several servers.
        Each distinct URL the program builds gets one of five independent servers."""
        urls = [self._redis(server) for server in self._fixture("redis_masters").servers]
        return f"_session_redis({found[0]}, {urls!r})"

    def zookeeper(self, _: re.Match[str]) -> str:
        return str(self._fixture("zookeeper_server").address)

    def mysql(self, found: re.Match[str]) -> str:
        server = self._fixture("mariadb_server")
        password = found["password"] or ""
        if secret := re.fullmatch(r"\$\{(\w+)\}", password):  # kept: the block reads it
            self.env[secret[1]] = server.password
        else:
            password = server.password
        return f"mysql+pymysql://locks:{password}@{server.address}/locks?charset=utf8mb4"

    def postgresql(self, found: re.Match[str]) -> str:
        server = self._fixture("postgresql_server")
        password = found["pgpassword"] or ""
        if secret := re.fullmatch(r"\$\{(\w+)\}", password):  # kept: the block reads it
            self.env[secret[1]] = server.password
        else:
            password = server.password
        url = f"{found['scheme']}://locks:{password}@{server.address}/locks"
        if not self.pg_table:  # a config may say create_table = false, as in production
            from locks.backends import DatabaseProvider  # noqa: PLC0415 - PostgreSQL blocks only

            provider = DatabaseProvider(server.url)
            provider.create_table()
            provider.close()
            self.pg_table = True
        return url

    def local_path(self, found: re.Match[str]) -> str:
        return str(self.tmp / found["name"])


# address in the docs -> the session's; one pass over programs and configs alike
REWRITES: list[tuple[str, Callable[[Servers, re.Match[str]], str]]] = [
    (r"\bf(?P<quote>[\"'])redis://[^\"'\s]*\{[^\"']*(?P=quote)", Servers.redis_template),
    (r"\bredis://(?:[^@\s\"'/{]*@)?(?P<redis>[\w.-]+(?::\d+)?)(?:/\d+)?(?![\w.{-])",
     Servers.redis),
    (r"(?<![\w.:-])[\w.-]+:2181(?![\d,])", Servers.zookeeper),
    (r"\bmysql(?:\+\w+)?://[^:@\s\"'/]+(?::(?P<password>[^@\s\"']*))?@[\w.-]+(?::\d+)?"
     r"/\w+(?:\?[^\s\"']*)?", Servers.mysql),
    (r"\b(?P<scheme>postgres(?:ql)?(?:\+\w+)?)://[^:@\s\"'/]+(?::(?P<pgpassword>[^@\s\"']*))?"
     r"@[\w.-]+(?::\d+)?/\w+(?:\?[^\s\"']*)?", Servers.postgresql),
    # files the docs put under /var or /tmp (a switch file, a SQLite database)
    (r"(?<=[\"'/])/(?:var|tmp)/(?:[\w.-]+/)*(?P<name>[\w.-]+)", Servers.local_path),
]  # fmt: skip
ADDRESSES = re.compile(
    "|".join(f"(?P<rule{n}>{pattern})" for n, (pattern, _) in enumerate(REWRITES))
)

SESSION_REDIS = '''
def _session_redis(url, servers, _given={}):
    """(test_docs) one of the session's servers for each distinct URL built here."""
    return _given.setdefault(url, servers[len(_given)])

'''


def rewrite(text: str, servers: Servers) -> str:
    def replace(found: re.Match[str]) -> str:
        rule = next(n for n in range(len(REWRITES)) if found[f"rule{n}"] is not None)
        return REWRITES[rule][1](servers, found)

    return ADDRESSES.sub(replace, text)


def needs_unavailable(text: str) -> str | None:
    for server, pattern in UNAVAILABLE.items():
        if re.search(pattern, text):
            return server
    return None


def skip_unavailable(block: Block, text: str) -> None:
    if server := needs_unavailable(text):
        pytest.skip(f"needs {server}, which the test session does not start")


def write_configs(block: Block, text: str, servers: Servers, *, always: bool) -> None:
    """Write the configs the block reads into its working dir, rewritten: ./locks.toml
    (when it names it, or `always`) and any repository .toml file it names by path."""
    files = {}
    if always or re.search(r"(?<![\w/.-])locks\.toml\b", text):
        files["locks.toml"] = block.config or (ROOT / DEFAULT_CONFIG).read_text()
    for name in set(re.findall(r"[\w./-]+/[\w.-]+\.toml\b", text)):
        if (ROOT / name).is_file() and not name.startswith("/"):
            files[name] = (ROOT / name).read_text()
    for name, content in files.items():
        skip_unavailable(block, content)
        path = servers.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rewrite(content, servers))


def environment(servers: Servers) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("LOCKS_", "PYTEST_"))}  # fmt: skip
    return {**env, **servers.env, "LOCKS_CONFIG": str(servers.tmp / "locks.toml")}


def failure(block: Block, shown: str, done: subprocess.CompletedProcess[str], why: str) -> str:
    numbered = "\n".join(f"{n:4} | {line}" for n, line in enumerate(shown.splitlines(), 1))
    return (
        f"{block.id}: {why}\n--- the block, as run ---\n{numbered}\n"
        f"--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-6000:]}"
    )


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as expired:

        def text(output: bytes | str | None) -> str:
            return output.decode(errors="replace") if isinstance(output, bytes) else output or ""

        return subprocess.CompletedProcess(
            argv, -9, text(expired.stdout), text(expired.stderr) + f"\n(timed out: {TIMEOUT} s)"
        )


# -- python --------------------------------------------------------------------------------


def stubs_for(source: str) -> str:
    """The stubs of the names `source` uses and does not define."""
    tree = ast.parse(source)
    used: set[str] = set()
    defined: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.alias):
            defined.add((node.asname or node.name).split(".")[0])
    return "".join(STUBS[name] + "\n" for name in STUBS if name in used - defined)


def run_python(block: Block, servers: Servers) -> None:
    program = stubs_for(block.text) + block.text
    skip_unavailable(block, program)
    write_configs(block, program, servers, always=False)
    program = rewrite(program, servers)
    if "_session_redis(" in program:
        program = SESSION_REDIS + program
    (servers.tmp / "block.py").write_text(program)
    done = run([sys.executable, "block.py"], servers.tmp, environment(servers))
    if done.returncode != 0:
        pytest.fail(failure(block, program, done, f"exit code {done.returncode}"), pytrace=False)


# -- shell ---------------------------------------------------------------------------------


class NotRun(Exception):
    """A command neither run nor checked, and why."""


@dataclass
class Shell:
    block: Block
    servers: Servers
    line: str  # as written, comment included
    program: str  # its first word
    env: dict[str, str]  # the command's own NAME=value prefixes

    def expected_exit(self) -> int:
        documented = re.search(r"#.*?\bexits?(?: code)? (\d+)\b", self.line)
        return int(documented[1]) if documented else 0

    def execute(self, argv: list[str], cwd: Path | None = None) -> None:
        done = run(argv, cwd or self.servers.tmp, {**environment(self.servers), **self.env})
        expected = self.expected_exit()
        why = f"`{self.line.strip()}` exited {done.returncode}, the docs say {expected}"
        if done.returncode != expected:
            pytest.fail(failure(self.block, self.block.text, done, why), pytrace=False)

    def expect(self, condition: object, problem: str) -> None:
        if not condition:
            pytest.fail(f"{self.block.id}: `{self.line.strip()}`: {problem}", pytrace=False)


def run_locks(shell: Shell, args: list[str]) -> None:
    shell.execute([LOCKS, *args])


def run_python_command(shell: Shell, args: list[str]) -> None:
    shell.execute([sys.executable, *args])


def collect_pytest(shell: Shell, args: list[str]) -> None:
    """The suite runs on its own: here, only that the selection names tests that exist."""
    shell.execute([sys.executable, "-m", "pytest", "--collect-only", "-q",
                   "-p", "no:cacheprovider", *args], cwd=ROOT)  # fmt: skip


def check_pip_install(shell: Shell, args: list[str]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    shell.expect(args[:1] == ["install"], "not a `pip install`")
    for requirement in (arg for arg in args[1:] if not arg.startswith("-")):
        found = re.fullmatch(r"([\w.-]+)(?:\[([\w,\s-]*)\])?", requirement)
        shell.expect(found, f"cannot read the requirement {requirement!r}")
        if found and found[1] == project["name"]:  # another package's: nothing to check
            extras = {extra.strip() for extra in (found[2] or "").split(",")} - {""}
            unknown = extras - set(project["optional-dependencies"])
            shell.expect(not unknown, f"pyproject.toml defines no extra {sorted(unknown)}")


def check_make(shell: Shell, args: list[str]) -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", makefile, re.MULTILINE))
    for arg in args:
        if variable := re.fullmatch(r"(\w+)=.*", arg):
            shell.expect(f"$({variable[1]})" in makefile, f"the Makefile never reads {arg}")
        else:
            shell.expect(arg in targets, f"the Makefile has no target {arg!r}")


def check_script(shell: Shell, args: list[str]) -> None:
    path = ROOT / shell.program
    shell.expect(path.is_file() and os.access(path, os.X_OK), "no such executable script")
    usage = re.search(r"usage: \S+ ([\w|]+)(.*?)\nEOF", path.read_text(), re.DOTALL)
    if usage and args:  # its actions, and the names its usage lists
        words = {*usage[1].split("|"), *re.findall(r"^  (\w+)\s", usage[2], re.MULTILINE)}
        shell.expect(set(args) <= words, f"its usage has no {sorted(set(args) - words)}")
    raise NotRun("installs, starts or stops servers on the machine's own ports (checked: "
                 "the script exists and takes these arguments)")  # fmt: skip


def check_docker(shell: Shell, args: list[str]) -> None:
    files = [args[at + 1] for at, arg in enumerate(args[:-1]) if arg == "-f"]
    missing = [name for name in files if not (ROOT / name).is_file()]
    shell.expect(not missing, f"no compose file {missing}")
    raise NotRun("needs Docker, and its servers take the machine's own ports (checked: the "
                 "compose files exist)")  # fmt: skip


def not_run(reason: str) -> Callable[[Shell, list[str]], None]:
    def action(shell: Shell, args: list[str]) -> None:
        raise NotRun(reason)

    return action


# each kind of command the docs show, by its program: what the test does with it
COMMANDS: dict[str, Callable[[Shell, list[str]], None]] = {
    "locks": run_locks,
    "python": run_python_command,
    "pytest": collect_pytest,
    "pip": check_pip_install,
    "make": check_make,
    "scripts/": check_script,
    "docker": check_docker,
    "mariadb": not_run("administers the reader's own MariaDB server"),
    "redis-cli": not_run("administers the reader's own Redis server"),
    "systemctl": not_run("starts or stops the machine's services"),
    "apt-get": not_run("installs system packages"),
    "git": not_run("clones or changes a repository"),
    "mkdocs": not_run("builds or serves the site (`make docs` builds it)"),
}


def program_of(word: str) -> str:
    if word.startswith("scripts/"):
        return "scripts/"
    name = word.rsplit("/", 1)[-1]  # .venv/bin/python is python
    return re.sub(r"^(python|pip)3(\.\d+)?$", r"\1", name)


def commands(block: Block) -> Iterator[str]:
    """The block's commands, continuation lines joined; comments kept for their exits.
    In a ```console block, only the lines after a `$ ` prompt (the rest is output)."""
    pending = ""
    for raw in block.text.splitlines():
        line = raw.strip()
        if block.lang == "console" and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line and not line.startswith("#"):
            yield line


# arguments that are the output of a run this test does not make
OUTPUTS = {".soak/": "reads the history of a `make soak` run"}


def run_shell(block: Block, servers: Servers) -> None:
    lines = list(commands(block))
    not_run: dict[str, list[str]] = {}  # reason -> commands
    for line in lines:
        words = shlex.split(line, comments=True)
        env = {}
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        shell = Shell(block, servers, line, words[0], env)
        kind = program_of(words[0])
        try:
            for output, reason in OUTPUTS.items():
                if any(word.startswith(output) for word in words):
                    raise NotRun(reason)
            shell.expect(kind in COMMANDS, "no rule for this kind of command: add one to COMMANDS")
            if kind in ("locks", "python"):
                skip_unavailable(block, line)
                write_configs(block, line, servers, always=True)
                words = shlex.split(rewrite(shlex.join(words), servers))
            COMMANDS[kind](shell, words[1:])
        except NotRun as reason:
            not_run.setdefault(str(reason), []).append(f"`{line.split(' #')[0].strip()}`")
    if not_run:
        done = len(lines) - sum(map(len, not_run.values()))
        reasons = "; ".join(f"{', '.join(shown)}: {why}" for why, shown in not_run.items())
        pytest.skip(f"ran or checked {done} of {len(lines)} commands; not run: {reasons}")


# -- toml ----------------------------------------------------------------------------------


def check_toml(block: Block, servers: Servers) -> None:
    problem = None
    try:
        data = tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as error:
        problem = f"not TOML: {error}"
    else:
        if "backends" in data:  # else a fragment: a table, a switch file, another tool's
            path = servers.tmp / "locks.toml"
            path.write_text(block.text)
            secrets = dict.fromkeys(re.findall(r"\$\{(\w+)\}", block.text), "secret")
            try:
                from_config(path, environ=secrets).close()
            except Exception as error:  # whatever it is, the page shows it
                problem = f"{type(error).__name__}: {error}"
    if problem:
        pytest.fail(f"{block.id}: {problem}\n--- the block ---\n{block.text}", pytrace=False)


RUNNERS: dict[str, Callable[[Block, Servers], None]] = {
    "python": run_python,
    "py": run_python,
    "sh": run_shell,
    "bash": run_shell,
    "console": run_shell,
    "shell": run_shell,
    "toml": check_toml,
}


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_docs_block(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if block.not_run:
        pytest.skip(f"marked not run: {block.not_run}")
    runner = RUNNERS.get(block.lang)
    if runner is None:
        pytest.skip(f"a ```{block.lang or '(no language)'} block: shown, not executed")
    runner(block, Servers(request, tmp_path))


def test_the_docs_have_blocks_of_every_kind() -> None:
    """The collection itself: a parser that found nothing would pass every page."""
    langs = {block.lang for block in BLOCKS}
    assert {"python", "sh", "toml"} <= langs, langs
    assert len({block.page for block in BLOCKS}) > 10
