namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>
/// Upper bounds for every wait in the suite, so that a broken transport fails a test instead of hanging CI.
/// They are generous for a loaded 2-core machine; a passing run takes a small fraction of each.
/// </summary>
public static class TestTimeouts
{
    /// <summary>One small step: a connect, an accept, a few bytes, a close being noticed.</summary>
    public static readonly TimeSpan Default = TimeSpan.FromSeconds(30);

    /// <summary>A transfer of tens or hundreds of megabytes, or a storm of hundreds of connections.</summary>
    public static readonly TimeSpan Large = TimeSpan.FromMinutes(3);

    /// <summary>How long a sender must stay blocked before the test counts it as stalled by backpressure.</summary>
    public static readonly TimeSpan StallObservation = TimeSpan.FromSeconds(1);

    /// <summary>How long threads of a disposed transport may take to exit after DisposeAsync returned.</summary>
    public static readonly TimeSpan ThreadExit = TimeSpan.FromSeconds(5);
}
