"""Runs mini-swe-agent, unmodified, on a crab sandbox made through Docker, for
integration/tests/mini_swe_agent.rs (docs/agents.md, "mini-swe-agent").

Run by the venv's python with one argument, a JSON object:
  image, run_args, docker   DockerEnvironment's image, run args and executable
  config                    a built-in config of mini-swe-agent ("mini" is the `mini` CLI's)
  model_class               "litellm" (tool calls) or "litellm_textbased" (fenced blocks)
  model, api_base, api_key, task, trajectory

mini-swe-agent's own classes do the work: DockerEnvironment starts the sandbox
(`docker run -d ... sleep`, with the run args) and runs each command with
`docker exec`; LitellmModel asks the LLM; DefaultAgent runs the loop with the
config's templates until the agent submits. The driver adds one thing, where the
agent's sockets live. The sandbox's network namespace exists only once
DockerEnvironment has started it, so the driver:
  1. prints `container <id>` once the sandbox runs,
  2. waits for a line on stdin holding the sandbox init's pid (the test starts
     the sandbox's turn proxy meanwhile),
  3. joins that process's network namespace, as `nsenter --net` would (setns(2);
     the docker CLI still reaches dockerd through its unix socket), so that the
     proxy is at 127.0.0.1 and nothing else is reachable (the line `host`
     instead: it stays in the host's network, for a baseline whose api_base is
     the LLM itself; the line `door <path>`: it stays in the host's network and
     asks its LLM through the sandbox proxy's host door, the unix socket at
     <path>, with an OpenAI client whose HTTP transport is that socket),
  4. runs the agent, prints `result <json>` (exit status, submission),
  5. waits for stdin to close, and exits 0 if the agent submitted, else 1.
"""

import ctypes
import json
import os
import sys
from pathlib import Path

import litellm
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_from_spec
from minisweagent.environments.docker import DockerEnvironment
from minisweagent.models import get_model

CLONE_NEWNET = 0x40000000


def join_network_namespace(pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/proc/{pid}/ns/net", "rb") as ns:
        if libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into the network namespace of {pid}: {os.strerror(err)}")


def main() -> int:
    args = json.loads(sys.argv[1])
    # litellm prints its list of providers for a model it finds no price for
    # in its own map (the registry adds it afterwards).
    litellm.suppress_debug_info = True
    config = get_config_from_spec(args["config"])

    env_config = dict(config.get("environment", {}))
    env_config.pop("environment_class", None)
    env_config.update(image=args["image"], run_args=args["run_args"], executable=args["docker"])
    env = DockerEnvironment(**env_config)
    print("container", env.container_id, flush=True)

    line = sys.stdin.readline()
    if not line.strip():
        print("no pid on stdin: the sandbox is left alone", file=sys.stderr)
        return 1
    line = line.strip()
    door = None
    if line.startswith("door "):
        door = line[len("door ") :]
    elif line != "host":
        join_network_namespace(int(line))

    api_base = args["api_base"]
    if door is not None:
        # litellm's OpenAI clients take their HTTP client from here; this one's
        # requests go to the door's socket (the URL's host is not used).
        import httpx

        litellm.client_session = httpx.Client(transport=httpx.HTTPTransport(uds=door))
        api_base = "http://sandbox/v1"
    model_config = dict(config.get("model", {}))
    model_config.update(
        model_name=args["model"],
        model_class=args["model_class"],
        model_kwargs={
            **model_config.get("model_kwargs", {}),
            "api_base": api_base,
            "api_key": args["api_key"],
        },
    )
    model = get_model(config=model_config)
    agent_config = dict(config.get("agent", {}))
    agent_config.pop("agent_class", None)
    agent_config["output_path"] = Path(args["trajectory"])
    agent = DefaultAgent(model, env, **agent_config)
    result = agent.run(args["task"])
    print("result", json.dumps(result), flush=True)

    sys.stdin.read()
    return 0 if result.get("exit_status") == "Submitted" else 1


if __name__ == "__main__":
    sys.exit(main())
