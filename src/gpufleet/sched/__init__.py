"""The queue's decisions, pure: which waiting job starts now, which waits and why, in what
order, and when each is likely to start. The server's loop (`gpufleet.server.loop`) feeds it the
store's rows and carries out what it returns."""
