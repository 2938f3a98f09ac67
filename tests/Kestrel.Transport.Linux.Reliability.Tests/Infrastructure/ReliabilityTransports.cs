namespace Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

/// <summary>
/// Theory data for the load and fault tests. Sockets always comes first: it proves the expectation.
/// The heavy tests run fewer Linux kinds than the conformance suite, to stay inside the CI budget.
/// </summary>
public static class ReliabilityTransports
{
    /// <summary>The reference, the Linux transport's scheduling modes that may block (ThreadPool, Adaptive) and its io_uring engine.</summary>
    public static TheoryData<TransportKind> Default =>
        new() { TransportKind.Sockets, TransportKind.LinuxNative, TransportKind.LinuxAdaptive, TransportKind.LinuxIoUring };

    /// <summary>Where it matters whether the app runs on the loop thread.</summary>
    public static TheoryData<TransportKind> Scheduling =>
        new()
        {
            TransportKind.Sockets, TransportKind.LinuxNative, TransportKind.LinuxInline, TransportKind.LinuxAdaptive, TransportKind.LinuxIoUring,
            TransportKind.LinuxIoUringInline, TransportKind.LinuxIoUringAdaptive,
        };

    /// <summary>Where it matters which engine performs the batch, and where the app runs.</summary>
    public static TheoryData<TransportKind> Engines =>
        new() { TransportKind.Sockets, TransportKind.LinuxNative, TransportKind.LinuxManaged, TransportKind.LinuxInline, TransportKind.LinuxAdaptive, TransportKind.LinuxAio, TransportKind.LinuxIoUring };
}
