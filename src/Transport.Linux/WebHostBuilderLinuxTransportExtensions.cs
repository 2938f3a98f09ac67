using Kestrel.Transport.Linux;
using Kestrel.Transport.Linux.Hosting;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Options;

namespace Microsoft.AspNetCore.Hosting;

/// <summary>Extension methods that put Kestrel on the Linux transport.</summary>
public static class WebHostBuilderLinuxTransportExtensions
{
    /// <summary>
    /// Makes Kestrel use the Linux transport for IP, Unix-socket and file-handle endpoints.
    /// Options bind from the <c>Kestrel:LinuxTransport</c> configuration section.
    /// On an operating system other than Linux this is a no-op that logs that the Sockets transport stays in use.
    /// </summary>
    /// <param name="hostBuilder">The web host builder.</param>
    /// <returns>The same builder.</returns>
    public static IWebHostBuilder UseLinuxTransport(this IWebHostBuilder hostBuilder)
        => hostBuilder.UseLinuxTransport(static _ => { });

    /// <summary>
    /// Makes Kestrel use the Linux transport, with options configured in code after those bound from
    /// the <c>Kestrel:LinuxTransport</c> configuration section.
    /// </summary>
    /// <param name="hostBuilder">The web host builder.</param>
    /// <param name="configureOptions">Configures the transport's options.</param>
    /// <returns>The same builder.</returns>
    public static IWebHostBuilder UseLinuxTransport(this IWebHostBuilder hostBuilder, Action<LinuxTransportOptions> configureOptions)
    {
        ArgumentNullException.ThrowIfNull(hostBuilder);
        ArgumentNullException.ThrowIfNull(configureOptions);

        return hostBuilder.ConfigureServices((context, services) =>
        {
            if (!OperatingSystem.IsLinux())
            {
                services.AddHostedService<NonLinuxNotice>();
                return;
            }

            services.AddOptions<LinuxTransportOptions>()
                .Bind(context.Configuration.GetSection(LinuxTransportOptions.ConfigurationSectionName))
                .Configure(configureOptions);
            services.AddSingleton<IValidateOptions<LinuxTransportOptions>, LinuxTransportOptionsValidator>();

            // Kestrel asks the most recently registered factory first, so adding ours after
            // UseKestrel's Sockets factory makes it win for every endpoint it can bind.
            services.AddSingleton<IConnectionListenerFactory, LinuxTransportFactory>();
        });
    }
}
