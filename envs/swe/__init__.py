"""SWE-bench-style software engineering tasks: fix a real bug in a repository, graded by hidden tests.

import gymnasium as gym, envhub
env = gym.make("envhub/SWE-v0")                      # the bundled offline task set
env = gym.make("envhub/SWE-v0", tasks="my.jsonl", repos_dir="repos/")
env = gym.make("envhub/SWE-v0", tasks="princeton-nlp/SWE-bench_Verified")   # each instance in its own image
"""

from envhub.envs.swe.datasets import load_tasks
from envhub.envs.swe.env import SWEEnv
from envhub.envs.swe.grading import GradeResult, grade
from envhub.envs.swe.tasks import SWEInstance, load_instances

__all__ = ["GradeResult", "SWEEnv", "SWEInstance", "grade", "load_instances", "load_tasks"]
