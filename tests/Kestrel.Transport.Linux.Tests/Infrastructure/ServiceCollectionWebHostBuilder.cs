using Microsoft.AspNetCore.Hosting;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.DependencyInjection;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>
/// Just enough of an <see cref="IWebHostBuilder"/> to run a transport's <c>Use…</c> extension against a bare
/// service collection. Sockets' public factory constructor cannot take a memory pool factory; its
/// <c>UseSockets()</c> registration picks one up from the container, so the transport-level tests build
/// Sockets exactly as a host would.
/// </summary>
internal sealed class ServiceCollectionWebHostBuilder(IServiceCollection services) : IWebHostBuilder
{
    private readonly Dictionary<string, string?> _settings = new(StringComparer.OrdinalIgnoreCase);
    private readonly WebHostBuilderContext _context = new()
    {
        Configuration = new ConfigurationBuilder().Build(),
        HostingEnvironment = null!,
    };

#pragma warning disable ASPDEPR008 // IWebHost is obsolete: it is only the return type of a member this builder never supports.
    public IWebHost Build() => throw new NotSupportedException("Only ConfigureServices is supported.");
#pragma warning restore ASPDEPR008

    public IWebHostBuilder ConfigureAppConfiguration(Action<WebHostBuilderContext, IConfigurationBuilder> configureDelegate)
        => throw new NotSupportedException("Only ConfigureServices is supported.");

    public IWebHostBuilder ConfigureServices(Action<IServiceCollection> configureServices)
    {
        configureServices(services);
        return this;
    }

    public IWebHostBuilder ConfigureServices(Action<WebHostBuilderContext, IServiceCollection> configureServices)
    {
        configureServices(_context, services);
        return this;
    }

    public string? GetSetting(string key) => _settings.GetValueOrDefault(key);

    public IWebHostBuilder UseSetting(string key, string? value)
    {
        _settings[key] = value;
        return this;
    }
}
