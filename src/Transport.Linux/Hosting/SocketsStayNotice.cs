using Kestrel.Transport.Linux.Diagnostics;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Hosting;

/// <summary>Tells the operator, once, that UseLinuxTransport() left Kestrel on its Sockets transport, and why.</summary>
internal sealed class SocketsStayNotice(ILoggerFactory loggerFactory, string reason) : IHostedService
{
    public Task StartAsync(CancellationToken cancellationToken)
    {
        TransportLog.TransportOff(loggerFactory.CreateLogger(TransportLog.Category), reason);
        return Task.CompletedTask;
    }

    public Task StopAsync(CancellationToken cancellationToken) => Task.CompletedTask;
}
