"""A runleader payload for the tests: appends "<pid> <token> <time>" to a file every 0.2 s."""

import os
import sys
import time

path = sys.argv[1]
while True:
    with open(path, "a") as out:
        out.write(f"{os.getpid()} {os.environ['DJANGO_LEADER_TOKEN']} {time.time():.3f}\n")
    time.sleep(0.2)  # the writer's pace: a line every 0.2 s until it is stopped
