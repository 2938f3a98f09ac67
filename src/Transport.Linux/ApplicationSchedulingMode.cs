namespace Kestrel.Transport.Linux;

/// <summary>
/// Where the application's continuations (Kestrel's HTTP parsing and the app itself) run
/// when data arrives on, or buffer space frees up for, a connection.
/// </summary>
public enum ApplicationSchedulingMode
{
    /// <summary>
    /// Continuations are queued to the .NET thread pool, batched per event loop so that a
    /// loop pass costs one thread-pool work item, not one per connection. Safe for any app,
    /// and a fixed choice: every request pays the hand-off to a pool thread.
    /// </summary>
    ThreadPool = 0,

    /// <summary>
    /// Continuations run on the event-loop thread itself, with no thread hop. Only for apps
    /// that never block: a blocking call stalls every connection owned by that loop for as
    /// long as it blocks. This is what Kestrel's Sockets transport calls
    /// <c>UnsafePreferInlineScheduling</c>.
    /// </summary>
    Inline = 1,

    /// <summary>
    /// Continuations run on the event-loop thread while they are quick, as with <see cref="Inline"/>. When one
    /// sleeps in the kernel for about a millisecond (a blocking call) or computes for 10 ms, the loop moves to
    /// another thread, so its other connections keep being served, and the connection that blocked runs on the
    /// thread pool for a while (1 s, doubling on each repeat up to 64 s), as with <see cref="ThreadPool"/>. On
    /// io_uring each loop's ring is set up so that it can change threads. The default.
    /// </summary>
    Adaptive = 2,
}
