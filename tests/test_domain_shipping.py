"""What the Ray backend ships to its workers: every domain pickled once with its data loaded (Domain.load_data,
__getstate__), the code digest the actors check, and the environment variables they receive."""
from __future__ import annotations

import asyncio
import pickle
import shutil
import threading

import pytest

from uqh.harness.backends.ray_actor import code_digest
from uqh.harness.backends.ray_backend import forwarded_environment
from uqh.harness.config.build import build_domain
from uqh.harness.episode.loop import EpisodeSpec, open_episode
from uqh.rundir.schema import RunConfig


def _domain(name: str, **options):
    cfg = RunConfig(domain=name, task_ids=[], model="openai/x", step_budget=3, prompt_sha256="", package_version="0",
                    domain_options=options, observation_chars=None)
    return build_domain(cfg)


async def _first_observation(domain, task_id: str) -> str:
    env, prompt, _ = await open_episode(domain, EpisodeSpec(episode_id=f"{task_id}#0", task_id=task_id,
                                                            sample_index=0, seed=1))
    try:
        return prompt
    finally:
        env.close()


@pytest.mark.parametrize("name,options", [
    ("arithmetic", {}), ("hotpotqa", {}), ("strategyqa", {}), ("webshop", {}),
])
def test_a_pickled_domain_carries_its_data_and_opens_the_same_episodes(name, options):
    domain = _domain(name, **options)
    domain.load_data()
    domain.prepare_runtime({"run_dir": "/somewhere"})
    copy = pickle.loads(pickle.dumps(domain))
    assert copy.runtime == {}  # run-time facts stay in the process that set them
    ids = domain.all_task_ids()
    assert copy.all_task_ids() == ids
    for task_id in ids[:3]:
        assert asyncio.run(_first_observation(copy, task_id)) == asyncio.run(_first_observation(domain, task_id))
    if name in ("hotpotqa", "strategyqa"):  # the bm25s index came along, its stemmer was made anew
        query = "the capital of France"
        assert [p.title for p in copy.retriever.search(query, 3)] == [p.title for p in domain.retriever.search(query, 3)]


def test_a_pickled_webshop_domain_needs_no_data_files(tmp_path, monkeypatch):
    from uqh.domains.webshop.catalog import default_data_dir

    data = tmp_path / "webshop"
    shutil.copytree(default_data_dir(), data)  # the packaged demo data
    domain = _domain("webshop", data=str(data))
    domain.load_data()
    blob = pickle.dumps(domain)
    shutil.rmtree(data)  # as on a node without the files
    monkeypatch.setattr("uqh.domains.webshop._RESOURCE_CACHE", {})  # nor this process's cache of them
    copy = pickle.loads(blob)
    tasks = copy.all_task_ids()
    assert tasks == domain.all_task_ids()
    assert asyncio.run(_first_observation(copy, tasks[0])) == asyncio.run(_first_observation(domain, tasks[0]))


def test_tau2_domain_pickles_without_its_thread_pool():
    domain = _domain("tau2-retail")
    domain.load_data()
    domain.user_executor()  # a pool and a lock exist now
    copy = pickle.loads(pickle.dumps(domain))
    assert copy._user_pool is None and isinstance(copy._user_pool_lock, type(threading.Lock()))
    assert copy.all_task_ids() == domain.all_task_ids() and copy.user_executor() is not domain.user_executor()
    domain.user_executor().shutdown(wait=False)
    copy.user_executor().shutdown(wait=False)


def test_code_digest_changes_with_any_source_or_prompt(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "uqh"  # code_digest covers the package's write path and prompts
    for top in ("rundir", "domains", "harness", "prompts"):
        shutil.copytree(root / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    base = code_digest(tmp_path)
    assert base == code_digest(root)
    (tmp_path / "prompts" / "arithmetic.txt").write_text("another prompt\n")
    assert code_digest(tmp_path) != base


def test_forwarded_environment_is_the_provider_settings_only():
    env = {"OPENAI_API_KEY": "k1", "OPENROUTER_API_KEY": "k2", "MYPROXY_API_KEY": "k3", "AWS_REGION_NAME": "eu",
           "VLLM_BASE_URL": "http://x", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "UQH_CACHE_DIR": "/d",
           "PATH": "/bin", "HOME": "/root", "PYTHONPATH": "/src", "RAY_ADDRESS": "auto", "CUDA_VISIBLE_DEVICES": "0",
           "VIRTUAL_ENV": "/v", "SSH_AUTH_SOCK": "/tmp/s"}
    assert forwarded_environment(env) == {
        "OPENAI_API_KEY": "k1", "OPENROUTER_API_KEY": "k2", "MYPROXY_API_KEY": "k3", "AWS_REGION_NAME": "eu",
        "VLLM_BASE_URL": "http://x", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "UQH_CACHE_DIR": "/d"}
