"""One-off probe (not part of make bench): 40 clients each announce a 100 MB registration
body to the embedded registry and stream 16 MiB of it; prints the registry's RSS before,
during and after. A refused body must be read away without being kept.

Usage: odmesh-control --serve-eureka 127.0.0.1:PORT ... & python3 refused_body_memory.py PORT PID
"""
import socket, sys, threading, time
port, pid = int(sys.argv[1]), int(sys.argv[2])
def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return line.split()[1] + " kB"
print("before", rss())
def client():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /eureka/apps/X HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000000\r\n\r\n")
    chunk = b"x" * 65536
    try:
        for _ in range(256):
            s.sendall(chunk)
    except OSError:
        pass
    time.sleep(3)
    s.close()
ts = [threading.Thread(target=client) for _ in range(40)]
[t.start() for t in ts]
time.sleep(2)
print("during", rss())
[t.join() for t in ts]
print("after", rss())
