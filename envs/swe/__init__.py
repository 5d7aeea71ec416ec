"""SWE-bench-style software engineering tasks: fix a real bug in a repository, graded by hidden tests.

    import gymnasium as gym, envhub
    env = gym.make("envhub/SWE-v0")                      # the bundled offline task set
    env = gym.make("envhub/SWE-v0", tasks="my.jsonl", repos_dir="repos/")
"""

from envhub.envs.swe.env import SWEEnv
from envhub.envs.swe.grading import GradeResult, grade
from envhub.envs.swe.tasks import SWEInstance, load_instances

__all__ = ["GradeResult", "SWEEnv", "SWEInstance", "grade", "load_instances"]
