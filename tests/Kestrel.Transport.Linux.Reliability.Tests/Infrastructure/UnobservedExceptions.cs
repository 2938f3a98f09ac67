using System.Collections.Concurrent;

namespace Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

/// <summary>Records task exceptions nobody observed, from construction to disposal.</summary>
internal sealed class UnobservedExceptions : IDisposable
{
    private readonly ConcurrentQueue<Exception> _seen = new();

    /// <summary>
    /// Finalizes what earlier tests left behind before it starts listening: a task another test failed to
    /// observe is that test's fault, and must not be reported as this one's.
    /// </summary>
    public UnobservedExceptions()
    {
        GC.Collect();
        GC.WaitForPendingFinalizers();
        TaskScheduler.UnobservedTaskException += OnUnobserved;
    }

    /// <summary>Collects twice around the finalizers, which is when unobserved exceptions are raised, then asserts there were none.</summary>
    public void AssertNone(string when)
    {
        GC.Collect();
        GC.WaitForPendingFinalizers();
        GC.Collect();
        GC.WaitForPendingFinalizers();
        Assert.True(_seen.IsEmpty, $"{when}: {_seen.Count} task exception(s) were never observed:{Environment.NewLine}{string.Join(Environment.NewLine, _seen.Take(5))}");
    }

    public void Dispose() => TaskScheduler.UnobservedTaskException -= OnUnobserved;

    private void OnUnobserved(object? sender, UnobservedTaskExceptionEventArgs e) => _seen.Enqueue(e.Exception);
}
