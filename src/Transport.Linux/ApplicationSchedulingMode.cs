namespace Kestrel.Transport.Linux;

/// <summary>
/// Where the application's continuations (Kestrel's HTTP parsing and the app itself) run
/// when data arrives on, or buffer space frees up for, a connection.
/// </summary>
public enum ApplicationSchedulingMode
{
    /// <summary>
    /// Continuations are queued to the .NET thread pool, batched per event loop so that a
    /// loop pass costs one thread-pool work item, not one per connection. Safe for any app.
    /// </summary>
    ThreadPool = 0,

    /// <summary>
    /// Continuations run on the event-loop thread itself, with no thread hop. Only for apps
    /// that never block: a blocking call stalls every connection owned by that loop.
    /// </summary>
    Inline = 1,
}
