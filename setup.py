"""Package discovery: the top-level folders `envs/`, `sandboxes/` and `trainer/` install as `envhub.envs`,
`envhub.sandboxes` and `envhub.trainer`; every package under them is found here, none is listed by hand.
Everything else about the project is in pyproject.toml."""

from setuptools import find_packages, setup

# import name -> folder in this repository
ROOTS = {"envhub": "envhub", "envhub.envs": "envs", "envhub.sandboxes": "sandboxes", "envhub.trainer": "trainer"}
# envs/swe/data holds the source trees of the bundled SWE projects: package data, not envhub code
NOT_CODE = ["*.data", "*.data.*", "data", "data.*"]

packages = [
    f"{name}.{sub}" if sub else name
    for name, folder in ROOTS.items()
    for sub in ["", *find_packages(folder, exclude=NOT_CODE)]
]

setup(package_dir=ROOTS, packages=packages)
