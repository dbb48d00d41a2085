python3 -c '
import socket
s=socket.socket(socket.AF_UNIX)
try: s.connect("\0netns-probe-s36"); print("abstract REACHED")
except OSError as e: print("abstract refused", e)'
ip route del prohibit 169.254.0.0/16 && echo ROUTE REMOVED || echo route kept
ip link set tap0 down && echo LINK DOWN || echo link kept
