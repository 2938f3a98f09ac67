namespace Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

public class Smoke
{
    [Fact]
    public void NativeEngineLoads() => TransportKind.LinuxNative.AssertEngineAvailable();
}
