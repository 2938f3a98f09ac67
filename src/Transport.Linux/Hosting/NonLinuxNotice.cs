using Kestrel.Transport.Linux.Diagnostics;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Hosting;

/// <summary>Tells the operator, once, that UseLinuxTransport() did nothing on this OS.</summary>
internal sealed class NonLinuxNotice(ILoggerFactory loggerFactory) : IHostedService
{
    public Task StartAsync(CancellationToken cancellationToken)
    {
        TransportLog.NotLinux(loggerFactory.CreateLogger(TransportLog.Category), Environment.OSVersion.VersionString);
        return Task.CompletedTask;
    }

    public Task StopAsync(CancellationToken cancellationToken) => Task.CompletedTask;
}
