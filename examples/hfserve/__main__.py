"""``python examples/hfserve ARGS`` (this folder as the program): the server, as ``python -m hfserve`` run here.

Python puts this folder first on the import path when it runs it, so the package beside this file is found
wherever the folder was copied, installed or not.
"""

from hfserve.server import main

main()
